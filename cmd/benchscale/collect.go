package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"time"
)

// record is one log line of a node.
type record struct {
	at    time.Time
	msg   string
	attrs map[string]any
}

func (r record) num(k string) float64 {
	switch v := r.attrs[k].(type) {
	case float64:
		return v
	case string:
		f, _ := strconv.ParseFloat(v, 64)
		return f
	}
	return 0
}

func (r record) round() uint64 { return uint64(r.num("round")) }

func readLog(path string) ([]record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []record
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var m map[string]any
		if json.Unmarshal(sc.Bytes(), &m) != nil {
			continue
		}
		ts, _ := m["time"].(string)
		at, err := time.Parse(time.RFC3339Nano, ts)
		if err != nil {
			continue
		}
		msg, _ := m["msg"].(string)
		out = append(out, record{at: at, msg: msg, attrs: m})
	}
	return out, sc.Err()
}

// stages are the seconds of one round's stages (see the table's notes).
type stages struct {
	lease, fetchHead, train, trainModel, encode, upload, screen, merge, eval, sign, attest, checkpoint, round float64
}

// roleRSS is peak RSS per model byte.
type roleRSS struct {
	leader, follower, trainer, worker float64
	// anon are the same for RssAnon (sampled): the process's own memory, without the file
	// pages of mapped or cached artifacts.
	leaderAnon, followerAnon, trainerAnon, workerAnon float64
}

// roleBytes are MB received and sent over libp2p during the round.
type roleBytes struct{ leaderIn, leaderOut, followerIn, followerOut, trainerIn, trainerOut float64 }

type rowResult struct {
	params   int64
	trainers int
	merged   int
	st       stages
	rss      roleRSS
	bytes    roleBytes
	wall     time.Duration
}

var progressRound = regexp.MustCompile(`round\s+(\d+)`)

// collect reads every node's log, result and history and works out the last round's
// stages, bytes and peak RSS.
func collect(params int64, trainers, rounds int, procs []*proc) (*rowResult, error) {
	R := uint64(rounds)
	model := float64(4 * params)
	res := &rowResult{params: params, trainers: trainers}
	logs := map[string][]record{}
	for _, p := range procs {
		recs, err := readLog(filepath.Join(p.dir, "log.jsonl"))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		logs[p.name] = recs
	}
	find := func(recs []record, msg string, round uint64) (record, bool) {
		var hit record
		ok := false
		for _, r := range recs {
			if r.msg == msg && r.round() == round {
				hit, ok = r, true // the last one (a round may have several lease attempts)
			}
		}
		return hit, ok
	}
	canonical := func(recs []record) (time.Time, bool) {
		for _, r := range recs {
			if r.msg != "progress" {
				continue
			}
			line, _ := r.attrs["line"].(string)
			if m := progressRound.FindStringSubmatch(line); m != nil && m[1] == strconv.FormatUint(R, 10) {
				return r.at, true
			}
		}
		return time.Time{}, false
	}

	// The round's leader is the validator that issued its leases.
	var leader *proc
	var issued record
	for _, p := range procs {
		if !p.validator {
			continue
		}
		if r, ok := find(logs[p.name], "issued leases", R); ok && (leader == nil || r.at.After(issued.at)) {
			leader, issued = p, r
		}
	}
	if leader == nil {
		return nil, fmt.Errorf("round %d: %w (no \"issued leases\")", R, errNoRound)
	}
	proposed, ok := find(logs[leader.name], "proposed head", R)
	if !ok {
		return nil, fmt.Errorf("round %d: the leader %s proposed no head", R, leader.name)
	}
	res.merged = int(proposed.num("merged"))

	// Trainers: from the lease to their announcement.
	var lastTrained time.Time
	for _, p := range procs {
		if p.validator {
			continue
		}
		recs := logs[p.name]
		tr, ok := find(recs, "trained", R)
		if !ok {
			return nil, fmt.Errorf("round %d: %s did not train", R, p.name)
		}
		window, fp, fs := tr.num("seconds"), tr.num("fetch_params_seconds"), tr.num("fetch_shards_seconds")
		// The last train call of the worker before the announcement is this round's, and
		// the last download of a model-sized artifact before it the head's params: a
		// trainer fetches a head's params as soon as the head is canonical, before any
		// lease on it arrives, so the lease's own fetch (fp) usually finds them there.
		var w, fetched float64
		for _, r := range recs {
			if r.msg == "fetched" && r.num("size") >= 0.9*model && !r.at.After(tr.at) {
				fetched = (r.num("transfer") + r.num("install")) / 1e9
			}
			if r.msg == "worker call" && r.attrs["op"] == "train" && !r.at.After(tr.at) {
				w = r.num("seconds")
				res.rss.worker = max(res.rss.worker, r.num("peak_kib")*1024/model)
				res.rss.workerAnon = max(res.rss.workerAnon, r.num("anon_kib")*1024/model)
			}
		}
		began := tr.at.Add(-time.Duration((window + fp) * float64(time.Second)))
		res.st.lease = max(res.st.lease, began.Sub(issued.at).Seconds())
		res.st.fetchHead = max(res.st.fetchHead, fetched, fp)
		res.st.train = max(res.st.train, w)
		res.st.trainModel = max(res.st.trainModel, tr.num("train_seconds"))
		res.st.encode = max(res.st.encode, window-w-fs)
		if tr.at.After(lastTrained) {
			lastTrained = tr.at
		}
	}

	// The leader: contributions fetched, then screened, merged, evaluated and signed.
	lrecs := logs[leader.name]
	var mergeStart, mergeEnd time.Time
	for _, r := range lrecs {
		if r.at.Before(issued.at) || r.at.After(proposed.at) {
			continue
		}
		switch {
		case r.msg == "merge stage":
			d := r.num("seconds")
			if mergeStart.IsZero() {
				mergeStart = r.at.Add(-time.Duration(d * float64(time.Second)))
			}
			switch r.attrs["stage"] {
			case "open", "screen":
				res.st.screen += d
			case "step":
				res.st.merge += d
			}
			mergeEnd = r.at
		case r.msg == "worker call" && r.attrs["op"] == "evaluate":
			res.st.eval += r.num("seconds")
		}
	}
	if mergeStart.IsZero() {
		return nil, fmt.Errorf("round %d: no merge stages in %s's log (debug level)", R, leader.name)
	}
	res.st.upload = max(0, mergeStart.Sub(lastTrained).Seconds())
	res.st.sign = max(0, proposed.at.Sub(mergeEnd).Seconds()-res.st.eval)

	// Followers attest; every node checkpoints the canonical head.
	lc, ok := canonical(lrecs)
	if !ok {
		return nil, fmt.Errorf("round %d: %s never held the head as canonical", R, leader.name)
	}
	var lastCanonical time.Time
	for _, p := range procs {
		recs := logs[p.name]
		if p.validator && p != leader {
			a, ok := find(recs, "attested head", R)
			if !ok {
				return nil, fmt.Errorf("round %d: %s did not attest", R, p.name)
			}
			res.st.attest = max(res.st.attest, a.at.Sub(proposed.at).Seconds())
		}
		c, ok := canonical(recs)
		if !ok {
			return nil, fmt.Errorf("round %d: %s never held the head as canonical", R, p.name)
		}
		if c.After(lastCanonical) {
			lastCanonical = c
		}
		if ck, ok := find(recs, "checkpoint saved", R); ok {
			res.st.checkpoint = max(res.st.checkpoint, ck.at.Sub(c).Seconds())
		}
	}
	_ = lc
	res.st.round = lastCanonical.Sub(issued.at).Seconds()

	// Peak RSS and bytes.
	for _, p := range procs {
		var nr nodeResult
		if err := readJSON(filepath.Join(p.dir, "result.json"), &nr); err != nil {
			return nil, fmt.Errorf("%s: %w", p.name, err)
		}
		ratio := float64(nr.PeakKiB) * 1024 / model
		anon := float64(nr.PeakAnonKiB) * 1024 / model
		in, out := nr.BytesIn/1e6/float64(rounds), nr.BytesOut/1e6/float64(rounds)
		switch {
		case p == leader:
			res.rss.leader, res.rss.leaderAnon = ratio, anon
			res.bytes.leaderIn, res.bytes.leaderOut = in, out
		case p.validator:
			res.rss.follower, res.rss.followerAnon = max(res.rss.follower, ratio), max(res.rss.followerAnon, anon)
			res.bytes.followerIn, res.bytes.followerOut = max(res.bytes.followerIn, in), max(res.bytes.followerOut, out)
		default:
			res.rss.trainer, res.rss.trainerAnon = max(res.rss.trainer, ratio), max(res.rss.trainerAnon, anon)
			res.bytes.trainerIn += in / float64(trainers)
			res.bytes.trainerOut += out / float64(trainers)
		}
	}
	return res, nil
}

// table prints the rows as they come.
type table struct{}

func newTable() *table { return &table{} }

const rowFmt = "%5s %3s | %6s %6s %6s %6s %6s %6s %6s %5s %5s %6s %6s | %6s | %7s %7s %7s %7s | %13s %13s %13s %13s\n"

func (t *table) header() {
	fmt.Printf(rowFmt, "size", "T", "lease", "fetch", "train", "encode", "upload", "screen", "merge", "eval", "sign", "attest", "ckpt", "round",
		"T in", "T out", "V in", "V out", "V-lead", "V-foll", "T", "worker")
	fmt.Printf(rowFmt, "", "", "s", "head s", "wall s", "s", "s", "s", "s", "s", "s", "s", "s", "s", "MB", "MB", "MB", "MB", "RSS (anon)/M", "RSS (anon)/M", "RSS (anon)/M", "RSS (anon)/M")
}

func (t *table) row(r *rowResult) {
	s := func(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) }
	mb := func(x float64) string { return strconv.FormatFloat(x, 'f', 0, 64) }
	x := func(x float64) string {
		if x == 0 {
			return "-"
		}
		return strconv.FormatFloat(x, 'f', 2, 64)
	}
	fmt.Printf(rowFmt, countName(r.params), strconv.Itoa(r.trainers), s(r.st.lease), s(r.st.fetchHead), s(r.st.train), s(r.st.encode),
		s(r.st.upload), s(r.st.screen), s(r.st.merge), s(r.st.eval), s(r.st.sign), s(r.st.attest), s(r.st.checkpoint), s(r.st.round),
		mb(r.bytes.trainerIn), mb(r.bytes.trainerOut), mb(r.bytes.leaderIn), mb(r.bytes.leaderOut),
		x(r.rss.leader)+" ("+x(r.rss.leaderAnon)+")", x(r.rss.follower)+" ("+x(r.rss.followerAnon)+")",
		x(r.rss.trainer)+" ("+x(r.rss.trainerAnon)+")", x(r.rss.worker)+" ("+x(r.rss.workerAnon)+")")
	if r.merged != r.trainers {
		fmt.Printf("      (%d of %d contributions merged)\n", r.merged, r.trainers)
	}
}

func (t *table) skip(params int64, trainers int, why string) {
	fmt.Printf("%5s %3d | %s\n", countName(params), trainers, why)
}

func (t *table) notes() {
	fmt.Print(`
size: parameters (fp32; model bytes M = 4 × size). T: trainers. Seconds of the last round's stages, the
slowest trainer's where trainers differ:
  lease   the leader's "issued leases" to the trainer starting its fetch of the base params
  fetch   params download (transfer + install); a trainer fetches a head's params as soon as the head is
          canonical, in parallel with the leader's leasing, so fetch and lease overlap
  train   the worker's wall time (start, load the base pack, copy, train, write the trained pack); the
          modelled training cost is fixed (see above)
  encode  the trainer's window minus the worker and shard fetch: the delta encoded and stored
  upload  the last trainer's announcement to the leader's merge start (the tail of fetching contributions)
  screen  contributions opened, norms, cosines, verdicts (round.Merger stages open + screen)
  merge   aggregate, outer step, next params and momentum written, head built (stage step)
  eval    held-out evaluation of the new head (worker wall)
  sign    head and notes signed, offered, published (after eval)
  attest  the leader's proposal to a follower's attestation (fetch contributions, re-merge, verify, sign)
  ckpt    canonical head to "checkpoint saved", slowest node
  round   leases issued to the last node holding the head as canonical
MB: libp2p bytes each node moved over its whole run divided by the rounds run (T: mean per trainer, V: the
round's leader); a trainer's include the genesis params and, if it came before the node stopped, the last head's.
RSS/M: peak RSS (VmHWM) of each process over its whole life (start-up, genesis, every round) over model bytes:
V-lead the round's leader, V-foll the largest follower, T the largest trainer (Go side), worker the largest
synthetic-workload call (it copies the params; a Python worker's memory is its own affair). In brackets the
largest RssAnon sampled every 50 ms: the process's own memory (heap, stacks), without the file pages of mapped
or cached artifacts that VmHWM counts too (a worker's: RssAnon as its call ends).
A row that does not fit: disk as each role stores (nothing pruned); RAM as the processes' own memory,
Σ anon/M × M + 100 MB a process, with the largest anon ratios measured at 100 M parameters and up (kept in
BENCH_SCALE_DIR/rss-ratios.json; before any, 1.5 a validator, 0.5 a trainer, 1.5 a worker); every trainer's
worker runs at once. File pages of the stores are cache and not counted.
`)
}
