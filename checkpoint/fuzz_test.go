package checkpoint

import (
	"reflect"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
)

// FuzzDecodeState feeds arbitrary bytes to the state file decoder: it must never panic,
// and whatever it accepts must encode back to something that decodes to the same state.
func FuzzDecodeState(f *testing.F) {
	id, _ := cid.V1Builder{Codec: 0x51, MhType: 0x12}.Sum([]byte("x"))
	good, err := encodeState(&State{
		Seq: 3, Round: 9, Head: "bafyhead",
		Blobs:   map[string]cid.Cid{"momentum": id},
		Refs:    map[string]cid.Cid{"params": id},
		Meta:    map[string]string{"k": "v"},
		SavedAt: time.Unix(0, 12345),
	})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(good)
	f.Add([]byte{})
	f.Add([]byte{0xa1, 0x01, 0x01})             // {1: 1}
	f.Add([]byte{0xa2, 0x01, 0x01, 0x01, 0x02}) // duplicate key
	f.Add([]byte{0xbf, 0xff})                   // indefinite-length map
	f.Fuzz(func(t *testing.T, b []byte) {
		st, err := decodeState(b)
		if err != nil {
			return
		}
		enc, err := encodeState(st)
		if err != nil {
			t.Fatalf("decoded state does not encode: %v", err)
		}
		again, err := decodeState(enc)
		if err != nil {
			t.Fatalf("re-encoded state does not decode: %v", err)
		}
		if !reflect.DeepEqual(st, again) {
			t.Fatalf("round trip changed the state:\n%+v\n%+v", st, again)
		}
	})
}

func TestStateNames(t *testing.T) {
	tests := []struct {
		name string
		seq  uint64
		ok   bool
	}{
		{stateName(1), 1, true},
		{stateName(^uint64(0)), ^uint64(0), true},
		{"state-1.cbor", 0, false},
		{"state-0000000000000000000x.cbor", 0, false},
		{".state-00000000000000000001.cbor.tmp1", 0, false},
		{"state-00000000000000000001.cbor.bak", 0, false},
		{"state-99999999999999999999.cbor", 0, false}, // overflows uint64
	}
	for _, tt := range tests {
		seq, ok := parseStateName(tt.name)
		if ok != tt.ok || seq != tt.seq {
			t.Errorf("parseStateName(%q) = %d, %v; want %d, %v", tt.name, seq, ok, tt.seq, tt.ok)
		}
	}
}
