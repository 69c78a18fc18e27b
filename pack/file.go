package pack

import (
	"fmt"
	"os"
	"syscall"
)

// File is a safetensors file viewed in place: on disk it is memory-mapped read-only, so
// tensor views cost no copy. Close releases the mapping; views are invalid afterwards.
type File struct {
	Header *Header
	data   []byte // the whole file
	mapped bool
	path   string
}

// Open maps a safetensors file and parses its header.
func Open(path string) (*File, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open safetensors %s: %w", path, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat safetensors %s: %w", path, err)
	}
	size := st.Size()
	if size < 8 {
		return nil, fmt.Errorf("open safetensors %s: %w: file is %d bytes", path, ErrMalformed, size)
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(size), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map safetensors %s: %w", path, err)
	}
	file, err := parse(data)
	if err != nil {
		_ = syscall.Munmap(data)
		return nil, fmt.Errorf("safetensors %s: %w", path, err)
	}
	file.mapped, file.path = true, path
	return file, nil
}

// Parse views buf (a whole safetensors file) without copying it.
func Parse(buf []byte) (*File, error) { return parse(buf) }

func parse(buf []byte) (*File, error) {
	h, err := ParseHeader(buf, int64(len(buf)))
	if err != nil {
		return nil, err
	}
	return &File{Header: h, data: buf}, nil
}

// Bytes returns the raw bytes of a tensor (a view into the file).
func (f *File) Bytes(t TensorInfo) []byte {
	return f.data[f.Header.DataStart+t.Begin : f.Header.DataStart+t.End]
}

// Data returns all data bytes (a view).
func (f *File) Data() []byte { return f.data[f.Header.DataStart:] }

// Path is the file's path, or "" for a parsed buffer.
func (f *File) Path() string { return f.path }

// Close unmaps the file. It is safe to call more than once.
func (f *File) Close() error {
	if f == nil || !f.mapped || f.data == nil {
		return nil
	}
	err := syscall.Munmap(f.data)
	f.data = nil
	return err
}
