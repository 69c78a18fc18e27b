package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"
	"github.com/ipfs/go-cid"
)

// The state file's bytes for a fixed state: pins its canonical encoding.
func TestGoldenStateEncoding(t *testing.T) {
	id, err := cid.Decode("bafireih43efbw6yylzhmqp5clznukqhmxbq5ileyrtxm73ifbnlwqzo5vy")
	if err != nil {
		t.Fatal(err)
	}
	st := &State{
		Seq: 12, Round: 34, Head: "bafyhead",
		Blobs:   map[string]cid.Cid{"outer": id, "residual": id},
		Refs:    map[string]cid.Cid{"params": id},
		Meta:    map[string]string{"k": "v", "": "empty key", "zz": ""},
		SavedAt: time.Unix(1700000000, 123456789),
	}
	b, err := encodeState(st)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	if got, want := hex.EncodeToString(sum[:]), "30e8c4a3404e03e53b2cae15f2e0fc367e5158f2bcbc0edb302e1aff5b3de84a"; got != want {
		t.Errorf("state sha256 %s, want %s: the state encoding changed", got, want)
	}
	if _, err := decodeState(b); err != nil {
		t.Fatal(err)
	}
}

// The decoder's strictness and limits, as they were when the encoding above was pinned.
func TestDecoderOptions(t *testing.T) {
	want := cbor.DecOptions{
		DupMapKey:         cbor.DupMapKeyEnforcedAPF,
		IndefLength:       cbor.IndefLengthForbidden,
		MaxNestedLevels:   4,
		MaxMapPairs:       1 << 16,
		MaxArrayElements:  1 << 16,
		ExtraReturnErrors: cbor.ExtraDecErrorUnknownField,
	}
	wantMode, err := want.DecMode()
	if err != nil {
		t.Fatal(err)
	}
	if got := decMode.DecOptions(); got != wantMode.DecOptions() {
		t.Errorf("decoder options %+v, want %+v", got, wantMode.DecOptions())
	}
}
