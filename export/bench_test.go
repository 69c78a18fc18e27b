package export

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/p2pnode/p2pnode/pack"
)

// benchSource is a 1 GiB model (four 8192×8192 float32 tensors), deterministic.
func benchSource(b *testing.B) *Source {
	b.Helper()
	l := pack.Layout{
		{Name: "layers.0.weight", Shape: []int64{8192, 8192}},
		{Name: "layers.1.weight", Shape: []int64{8192, 8192}},
		{Name: "layers.2.weight", Shape: []int64{8192, 8192}},
		{Name: "layers.3.weight", Shape: []int64{8192, 8192}},
	}
	vals := make([]float32, l.Params())
	rng := rand.New(rand.NewPCG(1, 2))
	for i := 0; i < len(vals); i += 2 {
		x := rng.Uint64()
		vals[i] = float32(int32(x)) / math.MaxInt32
		vals[i+1] = float32(int32(x>>32)) / math.MaxInt32
	}
	p, err := pack.New(l, vals, nil)
	if err != nil {
		b.Fatal(err)
	}
	src, err := NewSource(Meta{Network: "net", Experiment: "bench", Round: 1, Head: fakeCID("head", 1), Params: fakeCID("params", 1)}, p)
	if err != nil {
		b.Fatal(err)
	}
	return src
}

// BenchmarkInPlaceSync: a 1 GiB model is in the directory; each op brings it to a new
// version with 1% of its 64 KiB blocks changed (and a new round in the header), either by
// writing the whole model (temp file, fsync, rename) or by an in-place sync (diff, journal,
// changed blocks, fsync). written-B/op counts every byte written, the journal included.
func BenchmarkInPlaceSync(b *testing.B) {
	const block = DefaultBlockBytes
	src := benchSource(b)
	p, err := makePlan(src, DefaultShardBytes)
	if err != nil {
		b.Fatal(err)
	}
	hdr := int64(len(p.files[0].header))
	for _, mode := range []struct {
		name    string
		inPlace bool
	}{{"full-rewrite", false}, {"in-place", true}} {
		b.Run(mode.name, func(b *testing.B) {
			dir := b.TempDir()
			opts := Options{InPlace: mode.inPlace, BlockBytes: block}
			if _, err := Export(ctx, src, dir, Options{}); err != nil {
				b.Fatal(err)
			}
			rng := rand.New(rand.NewPCG(3, 4))
			var written, changed int64
			b.ResetTimer()
			for range b.N {
				b.StopTimer()
				src.Meta.Round++
				src.Meta.Head, src.Meta.Params = fakeCID("head", src.Meta.Round), fakeCID("params", src.Meta.Round)
				changeBlocks(src, hdr, block, 0.01, rng)
				b.StartTimer()
				rep, err := Export(ctx, src, dir, opts)
				if err != nil {
					b.Fatal(err)
				}
				written += rep.Written
				changed += rep.Changed
			}
			b.ReportMetric(float64(written)/float64(b.N), "written-B/op")
			if mode.inPlace {
				b.ReportMetric(float64(changed)/float64(b.N), "changed-B/op")
			}
		})
	}
}
