package validator

import (
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/internal/testenv"
)

// lockFixture is a validator's store with a chain of heads (rounds 0..top, each the
// parent of the next, none canonical) to lock and restore.
type lockFixture struct {
	t     testing.TB
	dir   string
	key   crypto.PrivKey
	self  string
	heads []*chain.SignedHead // by round, signed by self
}

func newLockFixture(t testing.TB, top uint64) *lockFixture {
	t.Helper()
	f := &lockFixture{t: t, dir: t.TempDir()}
	f.key, f.self = testenv.Key(t, "locking validator")
	var parent []byte
	for r := uint64(0); r <= top; r++ {
		h := &chain.Head{Version: 1, Network: "n", Experiment: "e", Round: r, Parent: parent,
			Params: cids.Record(fmt.Appendf(nil, "params %d", r)).Bytes(), LayoutHash: strings.Repeat("ab", 32),
			Policy: chain.Policy{Kind: "diloco", Aggregator: "mean", Codec: "fp32"},
			Ledger: chain.Ledger{Plan: "p", Shards: 1, Consumed: []byte{0}}}
		b, err := h.Encode()
		require.NoError(t, err)
		id, err := h.ID()
		require.NoError(t, err)
		sig, err := chain.Sign(f.key, id)
		require.NoError(t, err)
		f.heads = append(f.heads, &chain.SignedHead{Head: b, Sigs: []chain.Signature{sig}})
		parent = id.Bytes()
	}
	return f
}

// validator is a validator on the fixture's store (experiment e, quorum 2 of itself and
// another), its canonical head the fixture's head of round tip (none if tip < 0).
func (f *lockFixture) validator(experiment string, tip int) *validator {
	f.t.Helper()
	cfg := config.Default()
	cfg.Node.StoreDir = f.dir
	cfg.Experiment.ID = experiment
	heads, err := chain.OpenStore(filepath.Join(f.dir, "heads"))
	require.NoError(f.t, err)
	p := Params{Config: cfg, Log: slog.New(slog.DiscardHandler), Self: f.self, Key: f.key, Heads: heads, Sink: &testSink{},
		Validators: []string{f.self, "other"}}
	p.Tips = chain.NewTips(heads, p.Validators, 2)
	if tip >= 0 {
		sh := f.heads[tip]
		_, err := heads.Put(sh)
		require.NoError(f.t, err)
		h, err := sh.Decode()
		require.NoError(f.t, err)
		p.Tips.Restore(sh.ID(), h)
	}
	return newValidator(p)
}

// lockOf is the lock of the fixture's head of round r, as attest makes it.
func (f *lockFixture) lockOf(r uint64) lockedHead {
	sh := f.heads[r]
	return lockedHead{id: sh.ID(), msg: &gossip.Head{Experiment: "e", Signed: *sh,
		Proposal: &gossip.Proposal{Attempt: r}}}
}

// A validator's locks come back from LocksFile after a restart, those of closed rounds
// (at or below the canonical head) left out, and the locked heads are in the head store.
func TestLocksFileRestoresTheOpenRounds(t *testing.T) {
	for _, tc := range []struct {
		name          string
		writtenAt     int // the canonical head's round when the locks were taken (-1: none)
		locked        []uint64
		restartedAt   int
		want          []uint64
		wantErrSubstr string
	}{
		{"genesis before any head", -1, []uint64{0}, -1, []uint64{0}, ""},
		{"one open round", 4, []uint64{5}, 4, []uint64{5}, ""},
		{"a round taken over and the next", 4, []uint64{5, 6}, 4, []uint64{5, 6}, ""},
		{"rounds closed while the node was down", 3, []uint64{4, 5, 6}, 5, []uint64{6}, ""},
		{"every round closed", 3, []uint64{4, 5}, 6, nil, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newLockFixture(t, 7)
			v := f.validator("e", tc.writtenAt)
			for _, r := range tc.locked {
				require.NoError(t, v.lock(r, f.lockOf(r)))
			}
			again := f.validator("e", tc.restartedAt)
			require.NoError(t, again.restoreLocks())
			require.ElementsMatch(t, tc.want, slices.Collect(maps.Keys(again.locks)))
			for _, r := range tc.want {
				got, want := again.locks[r], f.lockOf(r)
				require.True(t, want.id.Equals(got.id), "round %d", r)
				gb, err := gossip.Encode(got.msg)
				require.NoError(t, err)
				wb, err := gossip.Encode(want.msg)
				require.NoError(t, err)
				require.Equal(t, wb, gb, "round %d: the message to re-publish", r)
				require.True(t, again.Heads.Has(got.id), "round %d: the locked head is in the head store", r)
			}
		})
	}
}

// The file holds only what the validator has locked since the rounds before its base
// were pruned: a lock taken after pruneLocks drops the closed rounds from the file too.
func TestLocksFileForgetsClosedRounds(t *testing.T) {
	f := newLockFixture(t, 7)
	v := f.validator("e", 3)
	require.NoError(t, v.lock(4, f.lockOf(4)))
	require.NoError(t, v.lock(5, f.lockOf(5)))
	v.pruneLocks(5)
	require.NoError(t, v.lock(6, f.lockOf(6)))
	b, err := os.ReadFile(filepath.Join(f.dir, LocksFile))
	require.NoError(t, err)
	locks, err := decodeLocks(b, f.self, "e")
	require.NoError(t, err)
	require.Equal(t, []uint64{6}, slices.Collect(maps.Keys(locks)))
}

// A LocksFile that cannot be read back stops the start with an error that names the file
// and says what to do; the validator signs nothing on a guess.
func TestLocksFileDamagedStopsTheStart(t *testing.T) {
	valid := func(f *lockFixture) []byte {
		b, err := encodeLocks(map[uint64]lockedHead{5: f.lockOf(5)})
		require.NoError(t, err)
		return b
	}
	for _, tc := range []struct {
		name       string
		experiment string
		content    func(f *lockFixture) []byte
		want       string
	}{
		{"garbage", "e", func(*lockFixture) []byte { return []byte("not a locks file") }, "cbor"},
		{"truncated", "e", func(f *lockFixture) []byte { b := valid(f); return b[:len(b)/2] }, "EOF"},
		{"empty", "e", func(*lockFixture) []byte { return nil }, "EOF"},
		{"of another experiment", "other", valid, `experiment "e", not "other"`},
		{"signed by another node", "e", func(f *lockFixture) []byte {
			l := f.lockOf(5)
			other, _ := testenv.Key(t, "another validator")
			sig, err := chain.Sign(other, l.id)
			require.NoError(t, err)
			l.msg.Signed.Sigs = []chain.Signature{sig}
			b, err := encodeLocks(map[uint64]lockedHead{5: l})
			require.NoError(t, err)
			return b
		}, "no signature of this node"},
		{"signature damaged", "e", func(f *lockFixture) []byte {
			l := f.lockOf(5)
			l.msg.Signed.Sigs = []chain.Signature{l.msg.Signed.Sigs[0]}
			l.msg.Signed.Sigs[0].Sig = slices.Clone(l.msg.Signed.Sigs[0].Sig)
			l.msg.Signed.Sigs[0].Sig[0] ^= 0xff
			b, err := encodeLocks(map[uint64]lockedHead{5: l})
			require.NoError(t, err)
			return b
		}, "round 5"},
		{"head of another round", "e", func(f *lockFixture) []byte {
			b, err := gossip.Encode(f.lockOf(5).msg)
			require.NoError(t, err)
			out, err := chain.Marshal(&lockFile{Locks: []lockRecord{{Round: 6, Head: b}}})
			require.NoError(t, err)
			return out
		}, "is of round 5"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newLockFixture(t, 7)
			path := filepath.Join(f.dir, LocksFile)
			require.NoError(t, os.WriteFile(path, tc.content(f), 0o644))
			v := f.validator(tc.experiment, 4)
			err := v.restoreLocks()
			require.ErrorIs(t, err, errLocksFile)
			require.ErrorContains(t, err, path)
			require.ErrorContains(t, err, tc.want)
			require.ErrorContains(t, err, "rounds after 4")
			require.ErrorContains(t, err, "delete it and start again")
			require.Empty(t, v.locks)
		})
	}
}

// A lock that cannot be written is not taken: the caller publishes nothing, and the
// validator may still sign a head of the round later.
func TestLockNotWrittenIsNotTaken(t *testing.T) {
	f := newLockFixture(t, 7)
	v := f.validator("e", 4)
	require.NoError(t, os.Mkdir(filepath.Join(f.dir, LocksFile), 0o755)) // the rename fails
	err := v.lock(5, f.lockOf(5))
	require.ErrorContains(t, err, "record signing lock of round 5")
	require.ErrorContains(t, err, f.lockOf(5).id.String())
	require.NotContains(t, v.locks, uint64(5))
}

// BenchmarkLock is the cost a validator pays per signature: the lock file's synchronous,
// fsynced write.
func BenchmarkLock(b *testing.B) {
	f := newLockFixture(b, 7)
	v := f.validator("e", 4)
	l := f.lockOf(5)
	for b.Loop() {
		if err := v.lock(5, l); err != nil {
			b.Fatal(err)
		}
	}
}

func FuzzDecodeLocks(f *testing.F) {
	lf := newLockFixture(f, 2)
	b, err := encodeLocks(map[uint64]lockedHead{1: lf.lockOf(1), 2: lf.lockOf(2)})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		locks, err := decodeLocks(b, lf.self, "e")
		if err != nil {
			return
		}
		for r, l := range locks {
			h, err := l.msg.Signed.Decode()
			if err != nil || h.Round != r || !l.id.Equals(l.msg.Signed.ID()) {
				t.Fatalf("round %d: decoded a lock that does not hold: %v", r, err)
			}
		}
	})
}
