package pyruntime

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"github.com/p2pnode/p2pnode/pack"
)

// BenchmarkPackRoundTrip moves one N-parameter pack (N from P2P_BENCH_PARAMS, default
// 100M = 400 MB) from Go into the Python model and back, against a floor:
//
//   - shm-baseline: Go writes the pack file to /dev/shm and reads it back the same way the
//     worker path reads its result (map the file, checksum every value). This is the floor:
//     one tmpfs write and one tmpfs read, no Python.
//   - worker: Go writes the pack, the worker loads it into the torch model (mmap + copy_),
//     exports the model to a new pack (writes from the tensors' buffers), Go maps the result
//     and checksums every value. The real path: two tmpfs writes and two reads.
//
// Every iteration writes fresh files and removes them (tmpfs page allocation and freeing
// are part of the cost in both) and checks that the checksum came back unchanged.
// The worker path does two tmpfs writes and two reads where the baseline does one of
// each, so about 2x the baseline is its floor; the Python half is as fast as Go's.
// Run with -v for the pack's shape and a summary line.
func BenchmarkPackRoundTrip(b *testing.B) {
	requireTorch(b)
	n := int64(100_000_000)
	if s := os.Getenv("P2P_BENCH_PARAMS"); s != "" {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v <= 0 {
			b.Fatalf("P2P_BENCH_PARAMS=%q", s)
		}
		n = v
	}
	w := benchWorker(b, map[string]any{"params": n}, 30*time.Minute, 60*time.Minute)
	ctx := context.Background()
	dir := w.ScratchDir()

	// The layout comes from the model; the values are Go's own (not the model's init).
	initPath := filepath.Join(dir, "init.safetensors")
	if err := w.Init(ctx, 1, initPath); err != nil {
		b.Fatal(err)
	}
	ip, err := pack.Load(initPath)
	if err != nil {
		b.Fatal(err)
	}
	layout := ip.Layout
	ip.Close()
	os.Remove(initPath)
	values := make([]float32, n)
	x := uint32(12345)
	for i := range values {
		x = x*1664525 + 1013904223
		values[i] = float32(int32(x)>>8) / (1 << 23)
	}
	p, err := pack.New(layout, values, nil)
	if err != nil {
		b.Fatal(err)
	}
	want := checksum(values)
	b.Logf("pack: %d tensors, %d parameters (%.0f MB), scratch %s", len(layout), n, float64(4*n)/1e6, dir)

	// The worker sub-benchmark also reports its time relative to the baseline ("x-shm"),
	// so the ratio shows without -v.
	nsPerOp := map[string]float64{}
	run := func(name, relTo, unit string, op func(i int) uint64) {
		b.Run(name, func(b *testing.B) {
			b.SetBytes(4 * n)
			// Go's side holds views, not copies: the process's peak RSS during the
			// iterations above its RSS before them (which holds the benchmark's own source
			// values), in pack sizes ("go-rss/pack"; the mapped result pack, 1, is the floor).
			before := resetPeakRSS()
			for i := 0; i < b.N; i++ {
				if got := op(i); got != want {
					b.Fatalf("checksum %x after the round trip, want %x", got, want)
				}
			}
			nsPerOp[name] = float64(b.Elapsed().Nanoseconds()) / float64(b.N)
			if ref := nsPerOp[relTo]; ref > 0 {
				b.ReportMetric(nsPerOp[name]/ref, unit)
			}
			if peak := peakRSS(); before > 0 && peak > 0 {
				b.ReportMetric(float64(peak-before)/float64(4*n), "go-rss/pack")
			}
		})
	}
	must := func(err error) {
		if err != nil {
			b.Fatal(err)
		}
	}

	run("shm-baseline", "", "", func(i int) uint64 {
		path := filepath.Join(dir, fmt.Sprintf("base-%d.safetensors", i))
		must(p.WriteFile(path))
		q, err := pack.Load(path)
		must(err)
		sum := checksum(q.Values)
		q.Close()
		os.Remove(path)
		return sum
	})
	run("worker", "shm-baseline", "x-shm", func(i int) uint64 {
		in := filepath.Join(dir, fmt.Sprintf("in-%d.safetensors", i))
		out := filepath.Join(dir, fmt.Sprintf("out-%d.safetensors", i))
		must(p.WriteFile(in))
		_, err := w.Load(ctx, in)
		must(err)
		_, err = w.Export(ctx, out)
		must(err)
		q, err := pack.Load(out)
		must(err)
		sum := checksum(q.Values)
		q.Close()
		os.Remove(in)
		os.Remove(out)
		return sum
	})
	if base, wk := nsPerOp["shm-baseline"], nsPerOp["worker"]; base > 0 && wk > 0 {
		b.Logf("worker / shm-baseline = %.2fx (target <= 2x)", wk/base)
	}
}

// resetPeakRSS resets this process's peak RSS (VmHWM; Linux: "5" to clear_refs) and
// returns its RSS now, or 0 where /proc does not tell.
func resetPeakRSS() int64 {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		return 0
	}
	return procStatusBytes("VmRSS:")
}

// peakRSS is this process's peak RSS since the last reset (0 where /proc does not tell).
func peakRSS() int64 { return procStatusBytes("VmHWM:") }

func procStatusBytes(field string) int64 {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, field); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0
			}
			return kb << 10
		}
	}
	return 0
}

// checksum touches every value: a sum of the values' bit patterns, read as 64-bit words.
func checksum(v []float32) uint64 {
	if len(v) == 0 {
		return 0
	}
	var s0, s1, s2, s3 uint64
	i := 0
	if uintptr(unsafe.Pointer(&v[0]))%8 == 0 {
		words := unsafe.Slice((*uint64)(unsafe.Pointer(&v[0])), len(v)/2)
		j := 0
		for ; j+4 <= len(words); j += 4 {
			s0 += words[j]
			s1 += words[j+1]
			s2 += words[j+2]
			s3 += words[j+3]
		}
		for ; j < len(words); j++ {
			s0 += words[j]
		}
		i = 2 * len(words)
	}
	for ; i < len(v); i++ {
		// Unaligned data (or the odd last value): add the same 64-bit words one value at a time.
		bits := uint64(math.Float32bits(v[i]))
		if i%2 == 1 {
			bits <<= 32
		}
		s1 += bits
	}
	return s0 + s1 + s2 + s3
}

// BenchmarkWorkerTrain runs 20 AdamW steps of a 17 M-parameter model (one 4096×4096
// layer) in a worker, with glibc's malloc as it comes (GLIBC_TUNABLES set to a harmless
// value turns mallocEnv off) and with the heap kept (mallocEnv). Each step frees and
// allocates tensors of 64 MiB; with every one a fresh mapping, the step's time is the
// kernel's page faults. The train call's own seconds are reported as train-s.
func BenchmarkWorkerTrain(b *testing.B) {
	requireTorch(b)
	for _, tc := range []struct{ name, tunables string }{
		{"glibc-default", "glibc.malloc.check=0"},
		{"heap-kept", ""},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.Setenv("GLIBC_TUNABLES", tc.tunables)
			w := benchWorker(b, map[string]any{"params": 17_000_000, "width": 4096, "batch_size": 32}, 10*time.Minute, 10*time.Minute)
			ctx := context.Background()
			base := filepath.Join(w.ScratchDir(), "base.safetensors")
			if err := w.Init(ctx, 1, base); err != nil {
				b.Fatal(err)
			}
			defer os.Remove(base)
			var seconds float64
			b.ResetTimer()
			for i := range b.N {
				out, opt := filepath.Join(w.ScratchDir(), "out.safetensors"), filepath.Join(w.ScratchDir(), "opt.safetensors")
				// The bench workload reads no shard: any file will do.
				res, err := w.Train(ctx, TrainJob{Base: base, Shards: []string{base}, Out: out, OptOut: opt, Steps: 20, Seed: int64(i)})
				if err != nil {
					b.Fatal(err)
				}
				seconds += res.Seconds
				os.Remove(out)
				os.Remove(opt)
			}
			b.ReportMetric(seconds/float64(b.N), "train-s")
		})
	}
}

// benchWorker starts a one-thread CPU worker on the bench workload, closed when b ends.
func benchWorker(b *testing.B, config map[string]any, call, train time.Duration) *Worker {
	b.Helper()
	w, err := NewWorker(Options{
		Interpreter: testInterpreter(), Factory: "p2ptrain.workloads.bench:Bench",
		Config: config, Threads: 1, Device: "cpu",
		CallTimeout: call, TrainTimeout: train, Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { w.Close() })
	if _, err := w.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	return w
}
