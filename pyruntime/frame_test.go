package pyruntime

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

func TestFrameRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	for _, p := range [][]byte{{}, []byte(`{"id":1}`), bytes.Repeat([]byte("x"), 1<<16)} {
		if err := writeFrame(&buf, p); err != nil {
			t.Fatal(err)
		}
		got, err := readFrame(&buf, MaxFrameSize)
		if err != nil || !bytes.Equal(got, p) {
			t.Fatalf("got %q, %v", got, err)
		}
	}
	if _, err := readFrame(&buf, MaxFrameSize); err != io.EOF {
		t.Fatalf("empty input: %v", err)
	}
}

func TestFrameLimits(t *testing.T) {
	if err := writeFrame(io.Discard, make([]byte, MaxFrameSize+1)); !errors.Is(err, errFrameTooLarge) {
		t.Fatalf("oversized write: %v", err)
	}
	hdr := binary.BigEndian.AppendUint32(nil, MaxFrameSize+1)
	if _, err := readFrame(bytes.NewReader(hdr), MaxFrameSize); !errors.Is(err, errFrameTooLarge) {
		t.Fatalf("oversized read: %v", err)
	}
	short := append(binary.BigEndian.AppendUint32(nil, 10), "abc"...)
	if _, err := readFrame(bytes.NewReader(short), MaxFrameSize); err != io.ErrUnexpectedEOF {
		t.Fatalf("truncated frame: %v", err)
	}
	if _, err := readFrame(bytes.NewReader([]byte{0, 0}), MaxFrameSize); err != io.ErrUnexpectedEOF {
		t.Fatalf("truncated header: %v", err)
	}
}

func FuzzReadFrame(f *testing.F) {
	f.Add([]byte{0, 0, 0, 2, '{', '}'})
	f.Add([]byte{0xff, 0xff, 0xff, 0xff})
	f.Add([]byte{0, 0, 0, 9, 'a'})
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := readFrame(bytes.NewReader(b), 1<<10)
		if err != nil {
			return
		}
		if len(got) > 1<<10 || len(b) < 4+len(got) || !bytes.Equal(got, b[4:4+len(got)]) {
			t.Fatalf("frame %q from %q", got, b)
		}
	})
}

func FuzzMetrics(f *testing.F) {
	f.Add([]byte(`{"a": 1, "b": "nan", "c": "-inf"}`))
	f.Add([]byte(`{"a": "x"}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		var m metrics
		_ = m.UnmarshalJSON(b)
	})
}
