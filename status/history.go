package status

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/host"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/internal/version"
)

// HistoryFile (in the store directory) keeps one JSON line per canonical head this node
// followed (a RoundPoint), for what only this node measured: the time between heads and
// the bytes it moved. Everything else in the history is rebuilt from the chain and its round
// notes (ChainHistory).
const HistoryFile = "history.jsonl"

// ChainHistory is the per-round series from genesis (or the oldest head this node holds,
// at most MaxHistory back) to head id: each head's round, train loss, samples and merged
// contributions, and its round notes (held-out metrics, rejections, time split), with this
// node's own measurements from its history file in dir where it has them.
func ChainHistory(dir string, heads *chain.Store, tips *chain.Tips, log *slog.Logger, id cid.Cid) []RoundPoint {
	local := map[string]RoundPoint{}
	for _, p := range LoadHistory(dir) {
		local[p.Head] = p
	}
	var out []RoundPoint
	err := heads.Walk(id, func(hid cid.Cid, h *chain.Head) error {
		p := HeadPoint(tips, hid, h)
		if l, ok := local[p.Head]; ok {
			p.Seconds, p.BytesIn, p.BytesOut = l.Seconds, l.BytesIn, l.BytesOut
			if p.HeldOut == nil && p.Time == nil {
				// Recorded before heads had notes.
				p.HeldOut, p.Rejected = l.HeldOut, l.Rejected
			}
		}
		out = append(out, p)
		if len(out) >= MaxHistory {
			return chain.StopWalk
		}
		return nil
	})
	if err != nil {
		// A node resumed from a peer's checkpoint may not hold the oldest heads.
		log.Debug("history: the chain held here is incomplete", "heads", len(out), "err", err)
	}
	slices.Reverse(out)
	return out
}

// HeadPoint is what the chain says of one head: the head and its round notes (from tips).
func HeadPoint(tips *chain.Tips, id cid.Cid, h *chain.Head) RoundPoint {
	p := RoundPoint{Round: h.Round, Head: id.String(), TrainLoss: h.Metrics.TrainLoss, Samples: h.Metrics.Samples,
		Merged: len(h.Contributions)}
	if n := tips.Notes(id); n != nil {
		p.SetNotes(n)
	}
	return p
}

// SetNotes sets what a head's round notes say of its round.
func (p *RoundPoint) SetNotes(n *chain.Notes) {
	p.HeldOut, p.HeldOutFailed, p.Rejected = n.HeldOut, n.HeldOutFailed, int(n.Rejected)
	if n.Seconds > 0 {
		p.Time = &RoundTime{Seconds: n.Seconds, Training: n.TrainSeconds, Communication: n.CommSeconds, Merge: n.MergeSeconds,
			Other: max(0, n.Seconds-n.TrainSeconds-n.CommSeconds-n.MergeSeconds)}
	}
}

// LoadHistory reads the last MaxHistory points of dir's history ("" or a missing file:
// none). A torn last line (a crash mid-write) is skipped.
func LoadHistory(dir string) []RoundPoint {
	f, err := os.Open(filepath.Join(dir, HistoryFile))
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []RoundPoint
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		var p RoundPoint
		if json.Unmarshal(sc.Bytes(), &p) != nil {
			continue
		}
		// A node resumed after losing its tip may follow a round again: keep the newest.
		for len(out) > 0 && out[len(out)-1].Round >= p.Round {
			out = out[:len(out)-1]
		}
		out = append(out, p)
		if len(out) > 2*MaxHistory {
			out = slices.Clone(out[len(out)-MaxHistory:])
		}
	}
	if len(out) > MaxHistory {
		out = out[len(out)-MaxHistory:]
	}
	return out
}

// AppendHistory adds one point to dir's history file, without the rates /status works
// out from the rest.
func AppendHistory(dir string, p RoundPoint) error {
	p.SamplesPerSecond, p.TokensPerSecond = 0, 0
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(filepath.Join(dir, HistoryFile), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// PeerStatus is one node of the swarm as this node sees it.
type PeerStatus struct {
	Peer      string    `json:"peer"`
	Self      bool      `json:"self,omitempty"`
	Roles     []string  `json:"roles,omitempty"`
	Validator bool      `json:"validator,omitempty"` // in this node's validator set
	Round     uint64    `json:"round"`
	Version   string    `json:"version,omitempty"`
	LastSeen  time.Time `json:"last_seen,omitzero"`
	Connected bool      `json:"connected"`
}

// PeerTable merges the peers heard from (announcements) with the connected ones, this node
// first.
func PeerTable(self string, roles []string, round uint64, validators []string, pr *PeerRounds, h host.Host) []PeerStatus {
	rows := map[string]*PeerStatus{}
	for id, a := range pr.snapshot() {
		rows[id] = &PeerStatus{Peer: id, Roles: a.roles, Round: a.round, Version: a.version, LastSeen: a.at}
	}
	if h != nil {
		for _, id := range h.Network().Peers() {
			s := id.String()
			if rows[s] == nil {
				rows[s] = &PeerStatus{Peer: s}
			}
			rows[s].Connected = true
		}
	}
	delete(rows, self)
	out := []PeerStatus{{Peer: self, Self: true, Roles: roles, Round: round, Version: version.Agent(), LastSeen: time.Now(), Connected: true}}
	for _, r := range rows {
		out = append(out, *r)
	}
	for i := range out {
		out[i].Validator = slices.Contains(validators, out[i].Peer)
	}
	slices.SortStableFunc(out[1:], func(a, b PeerStatus) int { return strings.Compare(a.Peer, b.Peer) })
	return out
}
