package detcbor

import (
	"bytes"
	"math"
	"testing"

	"github.com/fxamacker/cbor/v2"
)

// For every value without NaN or infinities the bytes are CoreDetEncOptions' own: the
// encoding checkpoint states and artifact manifests were written with before.
func TestMarshalIsCoreDeterministic(t *testing.T) {
	core, err := cbor.CoreDetEncOptions().EncMode()
	if err != nil {
		t.Fatal(err)
	}
	type rec struct {
		A uint64            `cbor:"1,keyasint"`
		B string            `cbor:"2,keyasint,omitempty"`
		C [][]byte          `cbor:"3,keyasint"`
		D map[string]string `cbor:"4,keyasint,omitempty"`
		E float64           `cbor:"5,keyasint"`
		F float32           `cbor:"6,keyasint"`
		G int64             `cbor:"7,keyasint"`
	}
	for _, v := range []any{
		rec{},
		rec{A: math.MaxUint64, B: "b", C: [][]byte{{1}, nil}, D: map[string]string{"zz": "", "a": "x", "": "e"}, E: 0.1, F: 1.5, G: -1 << 40},
		rec{E: 65504, F: math.SmallestNonzeroFloat32, G: math.MinInt64},
		rec{E: math.SmallestNonzeroFloat64, F: -0.0},
		map[string]float64{"x": math.MaxFloat64, "y": -5.960464477539063e-08},
		[]float32{1, 2.5, math.MaxFloat32},
	} {
		want, err := core.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		got, err := Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("%+v: % x, CoreDetEncOptions gives % x", v, got, want)
		}
	}
}

func TestMarshalRejectsNonFinite(t *testing.T) {
	for _, v := range []any{math.NaN(), math.Inf(1), math.Inf(-1), float32(math.Inf(-1)), []float64{1, math.NaN()}} {
		if b, err := Marshal(v); err == nil {
			t.Errorf("%v encoded as % x", v, b)
		}
	}
}

func TestDecMode(t *testing.T) {
	type rec struct {
		A uint64 `cbor:"1,keyasint"`
	}
	known := []byte{0xa1, 0x01, 0x02}               // {1: 2}
	unknown := []byte{0xa2, 0x01, 0x02, 0x02, 0x03} // {1: 2, 2: 3}
	dup := []byte{0xa2, 0x01, 0x02, 0x01, 0x03}     // {1: 2, 1: 3}
	indef := []byte{0xbf, 0x01, 0x02, 0xff}         // {_ 1: 2}
	for _, tc := range []struct {
		name string
		l    Limits
		in   []byte
		ok   bool
	}{
		{"known field", Limits{}, known, true},
		{"unknown field", Limits{}, unknown, false},
		{"unknown field allowed", Limits{AllowUnknownFields: true}, unknown, true},
		{"duplicate key", Limits{}, dup, false},
		{"duplicate key, unknown allowed", Limits{AllowUnknownFields: true}, dup, false},
		{"indefinite length", Limits{}, indef, false},
		{"too many pairs", Limits{MaxMapPairs: 16, AllowUnknownFields: true}, append([]byte{0xb1}, pairs(17)...), false},
		{"enough pairs", Limits{MaxMapPairs: 17, AllowUnknownFields: true}, append([]byte{0xb1}, pairs(17)...), true},
	} {
		dm, err := DecMode(tc.l)
		if err != nil {
			t.Fatal(err)
		}
		var r rec
		if err := dm.Unmarshal(tc.in, &r); (err == nil) != tc.ok {
			t.Errorf("%s: err %v, want ok %v", tc.name, err, tc.ok)
		}
	}
}

// pairs is n map pairs {1: 0, 2: 0, ...} with keys under 24.
func pairs(n int) []byte {
	var b []byte
	for i := 1; i <= n; i++ {
		b = append(b, byte(i), 0)
	}
	return b
}
