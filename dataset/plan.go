package dataset

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ipfs/go-cid"

	"github.com/p2pnode/p2pnode/cids"
)

// Microshard is a run of consecutive manifest files that is leased and trained as a unit.
type Microshard struct {
	Index int
	// ID is the raw sha2-256 CID of the newline-joined CIDs of its files (docs/formats.md).
	ID cid.Cid
	// Files are indices into the manifest's Files.
	Files []int
	Bytes int64
	// Examples sums the files' counts; files with an unknown (0) count add nothing.
	Examples int64
}

// Plan is a manifest cut into microshards.
type Plan struct {
	ManifestID  string
	TargetBytes int64
	Shards      []Microshard
}

// NewPlan cuts m into microshards of about targetBytes: files are taken in manifest order
// and a microshard is closed as soon as its bytes reach targetBytes, so only the last one
// may be smaller and a file larger than the target forms a microshard of its own. It is a
// pure function of the manifest and target: every node computes the same plan and ids.
//
// Microshard ids must be unique, since leases and the ledger name microshards by id;
// identical runs of file contents (the same bytes copied under two names) make the plan
// fail with an error naming both.
func NewPlan(m *Manifest, targetBytes int64) (*Plan, error) {
	if targetBytes <= 0 {
		return nil, fmt.Errorf("plan dataset %q: target bytes %d must be positive", m.Name, targetBytes)
	}
	if err := m.Validate(); err != nil {
		return nil, fmt.Errorf("plan dataset %q: %w", m.Name, err)
	}
	mid, err := m.ID()
	if err != nil {
		return nil, err
	}
	p := &Plan{ManifestID: mid.String(), TargetBytes: targetBytes}
	var cur Microshard
	for i, f := range m.Files {
		cur.Files = append(cur.Files, i)
		cur.Bytes += f.Bytes
		cur.Examples += f.Examples
		if cur.Bytes >= targetBytes || i == len(m.Files)-1 {
			cur.Index = len(p.Shards)
			cur.ID = shardID(m, cur.Files)
			p.Shards = append(p.Shards, cur)
			cur = Microshard{}
		}
	}
	seen := make(map[cid.Cid]int, len(p.Shards))
	for _, s := range p.Shards {
		if j, dup := seen[s.ID]; dup {
			return nil, fmt.Errorf("plan dataset %q: microshards %d (from %q) and %d (from %q) have identical contents, id %s",
				m.Name, j, m.Files[p.Shards[j].Files[0]].Path, s.Index, m.Files[s.Files[0]].Path, s.ID)
		}
		seen[s.ID] = s.Index
	}
	return p, nil
}

func shardID(m *Manifest, files []int) cid.Cid {
	ids := make([]string, len(files))
	for k, i := range files {
		ids[k] = m.Files[i].CID
	}
	return cids.Raw([]byte(strings.Join(ids, "\n")))
}

// ID identifies the plan: the raw sha2-256 CID of
//
//	"p2ptrain-plan/1\n" + manifest id + "\n" + target bytes + "\n" + shard ids joined by "\n"
//
// A plain text pre-image needs no encoder that could fail, and anyone can recompute it.
func (p *Plan) ID() cid.Cid {
	var b strings.Builder
	b.WriteString("p2ptrain-plan/1\n")
	b.WriteString(p.ManifestID)
	b.WriteByte('\n')
	b.WriteString(strconv.FormatInt(p.TargetBytes, 10))
	for _, s := range p.Shards {
		b.WriteByte('\n')
		b.WriteString(s.ID.String())
	}
	return cids.Raw([]byte(b.String()))
}

// Shard returns the microshard with the given id.
func (p *Plan) Shard(id cid.Cid) (Microshard, bool) {
	for _, s := range p.Shards {
		if s.ID.Equals(id) {
			return s, true
		}
	}
	return Microshard{}, false
}
