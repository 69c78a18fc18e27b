package chain

import (
	"crypto/sha256"
	"encoding/hex"
	"math"
	"strings"
	"testing"

	"github.com/fxamacker/cbor/v2"
	"github.com/ipfs/go-cid"
)

// goldenHead sets every field, floats of each width the encoder shortens to included, so
// the pinned CIDs below fix the canonical encoding: a change to the CBOR options that
// changes any head's bytes changes them.
func goldenHead(t *testing.T) *Head {
	t.Helper()
	parent, err := cid.Decode("bafireih43efbw6yylzhmqp5clznukqhmxbq5ileyrtxm73ifbnlwqzo5vy")
	if err != nil {
		t.Fatal(err)
	}
	return &Head{
		Version: 1, Network: "net", Experiment: "exp", Round: 7,
		Parent: parent.Bytes(), Params: parent.Bytes(), OuterState: parent.Bytes(),
		LayoutHash: strings.Repeat("ab", 32),
		Contributions: []Contribution{
			{Peer: "a", Artifact: parent.Bytes(), Lease: parent.Bytes(), Samples: 64, Weight: 0.5, Microshards: []uint32{1, 2, 300}, Loss: 2.302585092994046},
			{Peer: "b", Artifact: parent.Bytes(), Lease: parent.Bytes(), Samples: 1 << 40, Weight: 1.0 / 3, Microshards: []uint32{0}, Loss: 1e-300},
		},
		Policy:  Policy{Kind: "diloco", OuterLR: 0.7, Momentum: 0.9, Nesterov: true, Aggregator: "mean", Codec: "int8"},
		Metrics: Metrics{TrainLoss: 65504, Samples: 128, Screen: &ScreenStats{Rounds: 3, Norm: math.SmallestNonzeroFloat64, CohortN: 2, CohortMean: -0.25, CohortVar: float64(math.MaxFloat32), RefN: 1, RefMean: 1.5, RefVar: 5.960464477539063e-08}},
		Ledger:  Ledger{Plan: "plan", Shards: 16, Epoch: 2, Consumed: []byte{0xff, 0}},
	}
}

func TestGoldenHeadEncoding(t *testing.T) {
	h := goldenHead(t)
	b, err := h.Encode()
	if err != nil {
		t.Fatal(err)
	}
	id, err := h.ID()
	if err != nil {
		t.Fatal(err)
	}
	if got, want := id.String(), goldenHeadID; got != want {
		t.Errorf("head id %s, want %s: the canonical encoding changed", got, want)
	}
	sb, err := EncodeSigned(&SignedHead{Head: b, Sigs: []Signature{{Peer: "v1", Sig: []byte{9, 9}}, {Peer: "v2", Sig: nil}}})
	if err != nil {
		t.Fatal(err)
	}
	ss := sha256.Sum256(sb)
	if got, want := hex.EncodeToString(ss[:]), goldenSignedSum; got != want {
		t.Errorf("signed head sha256 %s, want %s", got, want)
	}
	back, err := DecodeHead(b)
	if err != nil {
		t.Fatal(err)
	}
	if id2, _ := back.ID(); !id2.Equals(id) {
		t.Errorf("decoded head re-encodes to %s, want %s", id2, id)
	}
}

// NaN and infinities are refused by the encoder rather than written in some form.
func TestEncodeRejectsNonFinite(t *testing.T) {
	for _, x := range []float64{math.NaN(), math.Inf(1), math.Inf(-1)} {
		h := goldenHead(t)
		h.Metrics.TrainLoss = x
		if _, err := h.Encode(); err == nil {
			t.Errorf("head with train loss %v encoded", x)
		}
	}
}

const (
	goldenHeadID    = "bafireic7qqqenopxvhevalu74nphltlvwij7xmj5dx7pt47ctpbaaqxugq"
	goldenSignedSum = "3d66cf1969c8eef03d30b6d10d84a58be652f9ef18230ae05c61636713624e5e"
)

// The decoder's strictness and limits, as they were when the encodings above were pinned.
func TestDecoderOptions(t *testing.T) {
	want := cbor.DecOptions{
		DupMapKey:         cbor.DupMapKeyEnforcedAPF,
		MaxArrayElements:  1 << 20,
		MaxMapPairs:       1 << 10,
		MaxNestedLevels:   8,
		IndefLength:       cbor.IndefLengthForbidden,
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
