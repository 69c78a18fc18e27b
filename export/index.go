package export

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
)

// maxIndexBytes bounds the index file we are willing to read (a model with a million
// tensors has an index of a few tens of MB).
const maxIndexBytes = 64 << 20

// ErrBadIndex is wrapped by every error about an index file that cannot be used.
var ErrBadIndex = errors.New("bad model index")

type indexMeta struct {
	TotalSize  int64  `json:"total_size"`
	Export     string `json:"p2pnode_export"`
	LayoutHash string `json:"layout_hash"`
}

type indexJSON struct {
	Metadata  indexMeta         `json:"metadata"`
	WeightMap map[string]string `json:"weight_map"`
}

// encodeIndex writes model.safetensors.index.json deterministically: two-space indent (as
// transformers writes it), keys sorted, no HTML escaping, a final newline. It depends only
// on the layout and the shard assignment, so an in-place sync never changes it.
func encodeIndex(weightMap map[string]string, totalSize int64, layoutHash string) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	enc.SetIndent("", "  ")
	err := enc.Encode(indexJSON{
		Metadata:  indexMeta{TotalSize: totalSize, Export: FormatVersion, LayoutHash: layoutHash},
		WeightMap: weightMap,
	})
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", IndexFile, err)
	}
	return b.Bytes(), nil
}

// modelIndex is a parsed index: what any safetensors index must give us.
type modelIndex struct {
	weightMap map[string]string // tensor → file
	files     []string          // distinct files, sorted
}

// parseIndex reads an index written by us or by other tools: only weight_map is required
// (metadata may hold anything). File names must be plain names of .safetensors files in
// the same directory: an index must not send us outside it.
func parseIndex(b []byte) (*modelIndex, error) {
	if len(b) > maxIndexBytes {
		return nil, fmt.Errorf("%w: %d bytes exceeds %d", ErrBadIndex, len(b), maxIndexBytes)
	}
	var raw struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadIndex, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data after the JSON object", ErrBadIndex)
	}
	if len(raw.WeightMap) == 0 {
		return nil, fmt.Errorf("%w: no weight_map entries", ErrBadIndex)
	}
	idx := &modelIndex{weightMap: raw.WeightMap}
	seen := map[string]bool{}
	for tensor, file := range raw.WeightMap {
		if tensor == "" {
			return nil, fmt.Errorf("%w: empty tensor name", ErrBadIndex)
		}
		if file == "" || len(file) > maxNameLen || strings.ContainsAny(file, "/\\\x00") ||
			file == "." || file == ".." || !strings.HasSuffix(file, ".safetensors") {
			return nil, fmt.Errorf("%w: tensor %q: file %q is not a .safetensors file in the model directory", ErrBadIndex, tensor, file)
		}
		if !seen[file] {
			seen[file] = true
			idx.files = append(idx.files, file)
		}
	}
	slices.Sort(idx.files)
	return idx, nil
}
