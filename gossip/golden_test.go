package gossip

import (
	"crypto/sha256"
	"encoding/hex"
	"testing"

	"github.com/ipfs/go-cid"
)

// The bytes of a fixed announcement, floats included: pins the message encoding.
func TestGoldenAnnounceEncoding(t *testing.T) {
	id, err := cid.Decode("bafireih43efbw6yylzhmqp5clznukqhmxbq5ileyrtxm73ifbnlwqzo5vy")
	if err != nil {
		t.Fatal(err)
	}
	a := &Announce{
		Experiment: "exp", Peer: "p", Roles: []string{"trainer"}, Capacity: 123.456, Version: "v1",
		Head: id.Bytes(), Round: 9, Time: 1700000000000, Artifacts: [][]byte{id.Bytes()},
		Metrics: map[string]float64{"loss": 0.1, "mem": 1 << 30, "zero": 0}, Started: 1, StepSeconds: 0.25,
	}
	b, err := Encode(a)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(b)
	if got, want := hex.EncodeToString(sum[:]), "7e4a65f03157c0384a79c921982d4b8be14c73c41239035a50e5ddd84c040e9e"; got != want {
		t.Errorf("announce sha256 %s, want %s: the message encoding changed", got, want)
	}
	if _, err := DecodeAnnounce(b); err != nil {
		t.Fatal(err)
	}
}
