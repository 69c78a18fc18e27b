package artifact

import (
	"bytes"
	"testing"

	"github.com/fxamacker/cbor/v2"
)

// The artifact id of fixed bytes: pins the manifest's canonical encoding and the chunk CIDs.
func TestGoldenManifestID(t *testing.T) {
	data := make([]byte, 5000)
	for i := range data {
		data[i] = byte(i * 7)
	}
	for _, tc := range []struct {
		chunk int
		want  string
	}{
		{MinChunkSize, "bafireih43efbw6yylzhmqp5clznukqhmxbq5ileyrtxm73ifbnlwqzo5vy"},
		{DefaultChunkSize, "bafireighy2f3tvoyrh26vgl7ehqtr3qzrt3c4q72cdx6lfti2xp24mcmle"},
	} {
		m, err := ManifestOf(bytes.NewReader(data), tc.chunk)
		if err != nil {
			t.Fatal(err)
		}
		if got := m.ID().String(); got != tc.want {
			t.Errorf("chunk size %d: artifact id %s, want %s: the manifest encoding changed", tc.chunk, got, tc.want)
		}
		back, err := DecodeManifest(m.Encode(), m.ID())
		if err != nil {
			t.Fatal(err)
		}
		if !back.ID().Equals(m.ID()) {
			t.Errorf("decoded manifest re-encodes to %s", back.ID())
		}
	}
	if got, want := ChunkCID([]byte("hello")).String(), "bafkr4ihkr4ld3m4gqkjf4reryxsy2s5tkbxprqkow6fin2iiyvreuzzab4"; got != want {
		t.Errorf("chunk cid %s, want %s", got, want)
	}
}

// The decoder's strictness and limits, as they were when the ids above were pinned (unknown
// fields are not an error here: a manifest must hash to its id, which its known fields fix).
func TestDecoderOptions(t *testing.T) {
	want := cbor.DecOptions{
		DupMapKey:        cbor.DupMapKeyEnforcedAPF,
		MaxArrayElements: MaxManifestBytes / 32,
		MaxNestedLevels:  4,
		IndefLength:      cbor.IndefLengthForbidden,
	}
	wantMode, err := want.DecMode()
	if err != nil {
		t.Fatal(err)
	}
	if got := decMode.DecOptions(); got != wantMode.DecOptions() {
		t.Errorf("decoder options %+v, want %+v", got, wantMode.DecOptions())
	}
}
