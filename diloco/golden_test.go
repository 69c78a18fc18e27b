package diloco

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/p2pnode/p2pnode/codecs"
)

// goldenVec builds inputs from integer random bits with exact conversions only (a 24-bit
// integer times a power of two), so they are the same bits on every architecture.
func goldenVec(seed uint64, n int) []float32 {
	rng := rand.New(rand.NewPCG(seed, 7))
	x := make([]float32, n)
	for i := range x {
		u := rng.Uint64()
		m := float32(int32(u>>40) - 1<<23)                        // exact: |m| < 2²⁴
		p := math.Float32frombits(uint32(127-23-int(u&15)) << 23) // 2^(−23−e), e in 0…15
		x[i] = m * p                                              // exact: times a power of two
	}
	return x
}

func digestOf(parts ...any) string {
	var b []byte
	for _, p := range parts {
		switch v := p.(type) {
		case []float32:
			for _, f := range v {
				b = binary.LittleEndian.AppendUint32(b, math.Float32bits(f))
			}
		case []byte:
			b = append(b, v...)
		}
	}
	h := sha256.Sum256(b)
	return hex.EncodeToString(h[:8])
}

// TestGoldenDigests pins the exact output bits on fixed inputs. The digests were recorded
// on amd64 and pass unchanged on arm64, ppc64le, s390x and 386 (under qemu with
// go test -exec): trainers and validators on different machines compute the same bytes.
func TestGoldenDigests(t *testing.T) {
	const n = 100003
	base, local := goldenVec(1, n), goldenVec(2, n)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name string
		want string
		run  func() string
	}{
		{"PseudoGradient", "48f3045ff22317af", func() string {
			d := make([]float32, n)
			must(PseudoGradient(d, base, local, 3))
			return digestOf(d)
		}},
		{"OuterStep/nesterov", "944127a94c029704", func() string {
			p, m := append([]float32(nil), base...), make([]float32, n)
			for range 3 {
				must(OuterStep(p, m, local, paperOuter, 3))
			}
			return digestOf(p, m)
		}},
		{"OuterStep/heavy-ball", "25628cb769c06318", func() string {
			p, m := append([]float32(nil), base...), make([]float32, n)
			for range 3 {
				must(OuterStep(p, m, local, OuterConfig{LR: 0.3, Momentum: 0.6}, 3))
			}
			return digestOf(p, m)
		}},
	}
	codecDigests := map[Codec]string{FP32: "97850b37adb5c7ad", FP16: "5d0b925b299324c6", Int8: "9a97a6df3d8660c3", Sparse: "a415b5ea65d5af81"}
	for _, c := range codecs.All() {
		cases = append(cases, struct {
			name string
			want string
			run  func() string
		}{"Encode+Decode/" + string(c), codecDigests[c], func() string {
			r := make([]float32, n)
			var parts []any
			for _, delta := range [][]float32{base, local} { // two rounds of error feedback
				e, err := Encode(c, delta, r, 100, 3)
				must(err)
				dec := make([]float32, n)
				must(Decode(e, dec, 3))
				parts = append(parts, e.Data, e.Scales, dec, append([]float32(nil), r...))
				if c == Sparse {
					parts = append(parts, e.Index)
				}
			}
			return digestOf(parts...)
		}})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := tc.run(); got != tc.want {
				t.Errorf("digest %s, want %s", got, tc.want)
			}
		})
	}
}
