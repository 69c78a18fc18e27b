package export

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestIndexRoundTripIsDeterministic(t *testing.T) {
	wm := map[string]string{"b.weight": ShardName(2, 2), "a.bias": ShardName(1, 2), "a<b>&": ShardName(1, 2)}
	b1, err := encodeIndex(wm, 1234, "abc")
	require.NoError(t, err)
	b2, err := encodeIndex(map[string]string{"a<b>&": ShardName(1, 2), "b.weight": ShardName(2, 2), "a.bias": ShardName(1, 2)}, 1234, "abc")
	require.NoError(t, err)
	require.Equal(t, b1, b2)
	require.Contains(t, string(b1), `"a<b>&"`, "no HTML escaping: names stay readable")
	require.Contains(t, string(b1), `"total_size": 1234`)
	idx, err := parseIndex(b1)
	require.NoError(t, err)
	require.Equal(t, wm, idx.weightMap)
	require.Equal(t, []string{ShardName(1, 2), ShardName(2, 2)}, idx.files)
}

func TestParseIndexAcceptsOtherWriters(t *testing.T) {
	// As transformers writes it: metadata with just total_size.
	idx, err := parseIndex([]byte(`{"metadata": {"total_size": 8}, "weight_map": {"w": "model-00001-of-00001.safetensors"}}`))
	require.NoError(t, err)
	require.Equal(t, []string{"model-00001-of-00001.safetensors"}, idx.files)
}

func TestParseIndexRejects(t *testing.T) {
	for _, tc := range []struct{ name, json string }{
		{"not json", `{`},
		{"no weight map", `{"metadata": {}}`},
		{"empty weight map", `{"weight_map": {}}`},
		{"path outside", `{"weight_map": {"w": "../x.safetensors"}}`},
		{"absolute path", `{"weight_map": {"w": "/etc/x.safetensors"}}`},
		{"not safetensors", `{"weight_map": {"w": "model.bin"}}`},
		{"empty tensor name", `{"weight_map": {"": "a.safetensors"}}`},
		{"wrong type", `{"weight_map": {"w": 3}}`},
		{"trailing data", `{"weight_map": {"w": "a.safetensors"}} {}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := parseIndex([]byte(tc.json))
			require.ErrorIs(t, err, ErrBadIndex)
		})
	}
}

func FuzzParseIndex(f *testing.F) {
	b, _ := encodeIndex(map[string]string{"a": ShardName(1, 2), "b": ShardName(2, 2)}, 8, "h")
	f.Add(b)
	f.Add([]byte(`{"weight_map": {"w": "../x.safetensors"}}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		idx, err := parseIndex(b)
		if err != nil {
			return
		}
		for _, file := range idx.files {
			if !isPlainSafetensorsName(file) {
				t.Fatalf("accepted file name %q", file)
			}
		}
	})
}

func isPlainSafetensorsName(s string) bool {
	for _, c := range s {
		if c == '/' || c == '\\' || c == 0 {
			return false
		}
	}
	return len(s) > len(".safetensors") && s[len(s)-len(".safetensors"):] == ".safetensors"
}
