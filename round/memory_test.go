package round

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/artifact"
	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/diloco"
	"github.com/p2pnode/p2pnode/internal/memprobe"
	"github.com/p2pnode/p2pnode/merge"
	"github.com/p2pnode/p2pnode/pack"
)

// memEnv selects the sizes TestMergeMemory measures, as "params:K,K;params:K": e.g.
// P2PNODE_MERGE_MEM='1000000:4,16;100000000:4,16'. Add "+inmem" after a K to also measure
// the whole-vector merge (the merge before streaming) at that size. The test is skipped
// without it: it writes K × 4 bytes × params to disk per size.
const memEnv = "P2PNODE_MERGE_MEM"

// memChildEnv makes the test binary run one merge (in a fresh process, so its peak RSS is
// the merge's alone) instead of the tests: "dir|mode".
const memChildEnv = "P2PNODE_MERGE_MEM_CHILD"

type memJob struct {
	Store  string
	Base   []byte
	BaseID string
	Cands  []memCand
}

type memCand struct {
	Peer    string
	Delta   string
	Samples uint64
	Shard   uint32
}

// TestMergeMemory measures a validator's peak RSS while it merges K fp32 contributions of
// a model of P parameters, streaming (Merge) and, where asked, whole-vector
// (mergeInMemory), each in a child process. It asserts the bound for the
// streaming merge: peak RSS ≤ 3 × model bytes + 256 MiB.
func TestMergeMemory(t *testing.T) {
	spec := os.Getenv(memEnv)
	if spec == "" {
		t.Skipf("set %s (e.g. '1000000:4,16;100000000:4,16') to measure merge memory", memEnv)
	}
	var rows []string
	for _, part := range strings.Split(spec, ";") {
		ps, ks, ok := strings.Cut(part, ":")
		require.True(t, ok, "bad %s part %q", memEnv, part)
		p, err := strconv.Atoi(ps)
		require.NoError(t, err)
		for _, kspec := range strings.Split(ks, ",") {
			kstr, inmem := strings.CutSuffix(kspec, "+inmem")
			k, err := strconv.Atoi(kstr)
			require.NoError(t, err)
			dir := t.TempDir()
			prep := time.Now()
			writeMemJob(t, dir, p, k)
			t.Logf("prepared P=%d K=%d in %v", p, k, time.Since(prep).Round(time.Millisecond))
			modes := []string{"stream"}
			if inmem {
				modes = append(modes, "inmem")
			}
			model := float64(4*p) / (1 << 20)
			for _, mode := range modes {
				rss, wall := memprobe.Child(t, "TestMergeMemoryChild", memChildEnv+"="+dir+"|"+mode)
				row := fmt.Sprintf("P=%-10d K=%-3d %-6s peak RSS %8.1f MiB = %5.2f × model (%6.1f MiB) + %7.1f MiB  wall %v",
					p, k, mode, rss, rss/model, model, rss-3*model, wall.Round(time.Millisecond))
				t.Log(row)
				rows = append(rows, row)
				if mode == "stream" {
					require.LessOrEqual(t, rss, 3*model+256, "streaming merge over the bound: %s", row)
				}
			}
		}
	}
	fmt.Println(strings.Join(rows, "\n"))
}

// writeMemJob stores a genesis of p parameters and k fp32 contributions (a shared direction
// plus per-trainer noise from a cheap generator) and writes the job description.
func writeMemJob(t *testing.T, dir string, p, k int) {
	store, err := artifact.OpenStore(filepath.Join(dir, "store"), artifact.Options{})
	require.NoError(t, err)
	policy := memPolicy()
	base, baseID := bigGenesis(t, store, p, policy, 5)
	job := memJob{Store: filepath.Join(dir, "store"), BaseID: baseID.String()}
	job.Base, err = base.Encode()
	require.NoError(t, err)
	data := make([]byte, 4*p)
	for j := range k {
		x := uint64(j+1) * 0x9e3779b97f4a7c15
		for i := 0; i < p; i++ {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
			shared := float32(int32(uint32(i)*2654435761)) / (1 << 31)
			noise := float32(int32(uint32(x))) / (1 << 31)
			binary.LittleEndian.PutUint32(data[4*i:], math.Float32bits(0.01*shared+0.005*noise))
		}
		id, err := StoreDelta(store, diloco.Encoded{Codec: diloco.FP32, N: p, Data: data}, base.LayoutHash)
		require.NoError(t, err)
		job.Cands = append(job.Cands, memCand{Peer: fmt.Sprintf("peer-%03d", j), Delta: id.String(), Samples: uint64(10 + j), Shard: uint32(j)})
	}
	b, err := json.Marshal(job)
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "job.json"), b, 0o644))
}

func memPolicy() Policy {
	return Policy{Kind: "diloco", Outer: diloco.OuterConfig{LR: 1, Momentum: 0.5, Nesterov: true}, Aggregator: merge.AggMean, Codec: diloco.FP32,
		Screen: merge.ScreenConfig{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4}}
}

// TestMergeMemoryChild runs one merge for TestMergeMemory; it does nothing otherwise.
func TestMergeMemoryChild(t *testing.T) {
	env := os.Getenv(memChildEnv)
	if env == "" {
		t.Skip("run by TestMergeMemory")
	}
	dir, mode, _ := strings.Cut(env, "|")
	b, err := os.ReadFile(filepath.Join(dir, "job.json"))
	require.NoError(t, err)
	var job memJob
	require.NoError(t, json.Unmarshal(b, &job))
	store, err := artifact.OpenStore(job.Store, artifact.Options{})
	require.NoError(t, err)
	base, err := chain.DecodeHead(job.Base)
	require.NoError(t, err)
	baseID, err := cid.Decode(job.BaseID)
	require.NoError(t, err)
	var cands []Candidate
	for _, c := range job.Cands {
		id, err := cid.Decode(c.Delta)
		require.NoError(t, err)
		cands = append(cands, Candidate{Peer: c.Peer, Delta: id, Samples: c.Samples, Microshards: []uint32{c.Shard}})
	}
	m := &Merger{Store: store, Policy: memPolicy()}
	switch mode {
	case "stream":
		out, err := m.Merge(context.Background(), baseID, base, cands)
		require.NoError(t, err)
		require.Len(t, out.Head.Contributions, len(cands))
	case "inmem":
		mergeInMemory(t, m, baseID, base, cands)
	default:
		t.Fatalf("unknown mode %q", mode)
	}
	memprobe.ReportPeak(t)
}

// encodeMemEnv selects the model sizes TestEncodeMemory measures (comma-separated
// parameter counts, e.g. P2PNODE_ENCODE_MEM=100000000); skipped without it.
const encodeMemEnv = "P2PNODE_ENCODE_MEM"

// TestEncodeMemory measures the Go side of a trainer turning the worker's output into a
// stored int8 contribution with error feedback (the residual, one model of float32, is
// kept by the trainer whatever the encoder): streaming (encodeStreaming) against the
// whole-vector path (load, delta, Encode, StoreDelta), each in a child process. It
// asserts the bound for streaming: ≤ 2 × model bytes + 256 MiB.
func TestEncodeMemory(t *testing.T) {
	spec := os.Getenv(encodeMemEnv)
	if spec == "" {
		t.Skipf("set %s (e.g. 100000000) to measure trainer encode memory", encodeMemEnv)
	}
	for _, ps := range strings.Split(spec, ",") {
		p, err := strconv.Atoi(ps)
		require.NoError(t, err)
		dir := t.TempDir()
		layout := pack.Layout{{Name: "w", Shape: []int64{int64(p)}}}
		vals := make([]float32, p)
		for i := range vals {
			vals[i] = float32(i%1000) * 0.001
		}
		for _, name := range []string{"base", "local"} {
			pk, err := pack.New(layout, vals, nil)
			require.NoError(t, err)
			require.NoError(t, pk.WriteFile(filepath.Join(dir, name)))
			for i := range vals {
				vals[i] += 0.0001 * float32(i%7)
			}
		}
		vals = nil
		model := float64(4*p) / (1 << 20)
		for _, mode := range []string{"stream", "inmem"} {
			rss, wall := memprobe.Child(t, "TestEncodeMemoryChild", memChildEnv+"="+dir+"|"+mode)
			row := fmt.Sprintf("trainer encode P=%-10d int8+residual %-6s peak RSS %8.1f MiB = %5.2f × model (%6.1f MiB)  wall %v",
				p, mode, rss, rss/model, model, wall.Round(time.Millisecond))
			t.Log(row)
			fmt.Println(row)
			if mode == "stream" {
				require.LessOrEqual(t, rss, 2*model+256, row)
			}
		}
	}
}

// TestEncodeMemoryChild runs one encode for TestEncodeMemory; it does nothing otherwise.
func TestEncodeMemoryChild(t *testing.T) {
	env := os.Getenv(memChildEnv)
	if env == "" {
		t.Skip("run by TestEncodeMemory")
	}
	dir, mode, _ := strings.Cut(env, "|")
	store, err := artifact.OpenStore(filepath.Join(dir, "store-"+mode), artifact.Options{})
	require.NoError(t, err)
	switch mode {
	case "stream":
		baseR, err := pack.OpenPackReader(filepath.Join(dir, "base"))
		require.NoError(t, err)
		localR, err := pack.OpenPackReader(filepath.Join(dir, "local"))
		require.NoError(t, err)
		residual := make([]float32, baseR.Layout.Params())
		_, _, err = encodeStreaming(store, baseR, localR, diloco.Int8, 0, residual, 0)
		require.NoError(t, err)
	case "inmem":
		base, err := pack.Load(filepath.Join(dir, "base"))
		require.NoError(t, err)
		local, err := pack.Load(filepath.Join(dir, "local"))
		require.NoError(t, err)
		delta := make([]float32, len(base.Values))
		require.NoError(t, diloco.PseudoGradient(delta, base.Values, local.Values, 0))
		residual := make([]float32, len(delta))
		enc, err := diloco.Encode(diloco.Int8, delta, residual, 0, 0)
		require.NoError(t, err)
		_, err = StoreDelta(store, enc, base.Layout.Hash())
		require.NoError(t, err)
	}
	memprobe.ReportPeak(t)
}
