// Command benchtable reads `go test -bench` output on stdin and prints the project's
// benchmark table: each row a ratio between two benchmarks of the same run (medians over
// -count repetitions) against its target. It exits 0 whatever the ratios are: the table is
// a measurement, not a test.
package main

import (
	"bufio"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// row compares a candidate benchmark with its same-run baseline.
type row struct {
	what      string
	candidate string // benchmark name without the -GOMAXPROCS suffix
	baseline  string
	unit      string // the metric compared; the ratio is candidate/baseline of its medians
	target    string // e.g. "<= 2", ">= 0.8"
}

var rows = []row{
	{"pack round trip Go→worker→Go vs write+read on /dev/shm (time ratio)",
		"BenchmarkPackRoundTrip/worker", "BenchmarkPackRoundTrip/shm-baseline", "ns/op", "<= 2"},
	{"worker: 20 AdamW steps at 17M, glibc malloc as it comes vs the heap kept (speed-up)",
		"BenchmarkWorkerTrain/glibc-default", "BenchmarkWorkerTrain/heap-kept", "ns/op", ">= 1"},
	{"merge 8×25M weighted mean vs plain summing loop (read throughput ratio)",
		"BenchmarkMerge8x25M/weighted-mean", "BenchmarkMerge8x25M/plain-sum", "MB/s", ">= 0.8"},
	{"mocknet, capped links: fetch from 4 holders vs from 1 (speed-up)",
		"BenchmarkSwarmFetch/holders-1", "BenchmarkSwarmFetch/holders-4", "ns/op", ">= 3"},
	{"in-place sync of a 1 GiB model, 1% blocks changed vs full rewrite (time ratio)",
		"BenchmarkInPlaceSync/in-place", "BenchmarkInPlaceSync/full-rewrite", "ns/op", "<= 0.5"},
	{"in-place sync: bytes written vs full rewrite",
		"BenchmarkInPlaceSync/in-place", "BenchmarkInPlaceSync/full-rewrite", "written-B/op", "<= 0.05"},
}

// absolute rows are numbers a benchmark reports directly, with a target.
var absolute = []struct{ what, name, unit, target string }{
	{"artifact fetch 256 MiB, CPU per byte vs the verify+store floor (raw + BLAKE3 + O_DIRECT)",
		"BenchmarkArtifactFetch", "protocol-cpu-vs-floor", "<= 1.1"},
	{"  no target (retired 0.85: bound by 2 cores): fetch vs one raw libp2p stream, loopback",
		"BenchmarkArtifactFetch", "protocol-vs-raw", ""},
	{"  floor, no target: raw stream + BLAKE3 of every MiB vs raw stream",
		"BenchmarkArtifactFetch", "raw+blake3-vs-raw", ""},
	{"  floor, no target: raw stream written to disk (O_DIRECT, fsync) vs raw stream",
		"BenchmarkArtifactFetch", "raw-to-disk-vs-raw", ""},
	{"  floor, no target: raw stream hashed and written (verify + store, no protocol) vs raw",
		"BenchmarkArtifactFetch", "raw+blake3-to-disk-vs-raw", ""},
	{"  no target: artifact fetch vs that verify+store floor (the protocol's own overhead)",
		"BenchmarkArtifactFetch", "protocol-vs-floor", ""},
	{"pack round trip Go→worker→Go: Go's peak RSS above its start, in pack sizes (views, not copies)",
		"BenchmarkPackRoundTrip/worker", "go-rss/pack", "<= 1.5"},
	{"gossip: head announcement to all 50 nodes, p99 latency (ms)", "BenchmarkGossip", "p99-ms", "<= 100"},
	{"gossip: burst of 100 messages, delivered to every node", "BenchmarkGossip", "burst-delivered", ">= 100"},
}

var line = regexp.MustCompile(`^(Benchmark\S+?)(-\d+)?\s+\d+\s+(.*)$`)

func main() {
	samples := map[string]map[string][]float64{} // name → unit → values
	extra := map[string]bool{}
	sc := bufio.NewScanner(os.Stdin)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := line.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		name := m[1]
		f := strings.Fields(m[3])
		for i := 0; i+1 < len(f); i += 2 {
			v, err := strconv.ParseFloat(f[i], 64)
			if err != nil {
				continue
			}
			if samples[name] == nil {
				samples[name] = map[string][]float64{}
			}
			samples[name][f[i+1]] = append(samples[name][f[i+1]], v)
			extra[name+" "+f[i+1]] = true
		}
	}
	median := func(name, unit string) (float64, int, bool) {
		v := slices.Clone(samples[name][unit])
		if len(v) == 0 {
			return 0, 0, false
		}
		slices.Sort(v)
		return v[len(v)/2], len(v), true
	}
	fmt.Printf("%-88s %12s %8s  %s\n", "comparison (same run, medians)", "ratio", "target", "")
	fmt.Println(strings.Repeat("-", 120))
	for _, r := range rows {
		c, nc, ok1 := median(r.candidate, r.unit)
		b, _, ok2 := median(r.baseline, r.unit)
		if !ok1 || !ok2 || b == 0 {
			continue
		}
		ratio := c / b
		fmt.Printf("%-88s %11.2f× %8s  %s (n=%d)\n", r.what, ratio, r.target, verdict(ratio, r.target), nc)
	}
	shown := map[string]bool{}
	for _, a := range absolute {
		shown[a.name+" "+a.unit] = true
		if v, n, ok := median(a.name, a.unit); ok {
			fmt.Printf("%-88s %12.4g %8s  %s (n=%d)\n", a.what, v, a.target, verdict(v, a.target), n)
		}
	}
	fmt.Println()
	// Other numbers the benchmarks report (for the record, no target).
	var keys []string
	for k := range extra {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		name, unit, _ := strings.Cut(k, " ")
		if shown[k] {
			continue
		}
		switch unit {
		case "MB/s", "ns/op", "B/op", "allocs/op", "cpu-ns/B", "x-shm", "go-rss/pack":
			continue
		}
		v, n, _ := median(name, unit)
		fmt.Printf("%-88s %12.4g %s (n=%d)\n", strings.TrimPrefix(name, "Benchmark")+" "+unit, v, "", n)
	}
}

func verdict(ratio float64, target string) string {
	op, num, _ := strings.Cut(target, " ")
	t, err := strconv.ParseFloat(num, 64)
	if err != nil {
		return ""
	}
	switch op {
	case "<=":
		if ratio <= t {
			return "met"
		}
	case ">=":
		if ratio >= t {
			return "met"
		}
	}
	return "MISSED"
}
