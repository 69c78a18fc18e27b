package validator

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/gossip"
	"github.com/p2pnode/p2pnode/lease"
)

// TestRestartedLeaderKnowsItsOwnGrants: a leader killed right after a grant, started again,
// gets its trainers' contributions under that grant's leases. From GrantsFile it knows them
// for its own: rejected as late, no strike toward quarantine and no bar from the round, so
// the trainers may still report on the leases of its new grant. Without the file (lost,
// damaged, or a grant of another round only) they are leases nobody is known to have
// granted: the trainer is barred from the round while the verdict waits (hold).
func TestRestartedLeaderKnowsItsOwnGrants(t *testing.T) {
	for _, tc := range []struct {
		name string
		file func(t *testing.T, path string) // what happens to GrantsFile before the restart
		late bool
	}{
		{"file kept", func(*testing.T, string) {}, true},
		{"file lost", func(t *testing.T, path string) { require.NoError(t, os.Remove(path)) }, false},
		{"file damaged", func(t *testing.T, path string) { require.NoError(t, os.WriteFile(path, []byte("not cbor"), 0o644)) }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			before := newLeasedRound(t, "t1")
			before.v.Config.Node.StoreDir = dir
			grant := &gossip.Leases{Experiment: before.v.Config.Experiment.ID, Round: fetchRound, Base: before.base.Bytes(),
				Issuer: "A", Deadline: time.Now().Add(time.Minute).UnixMilli(), Leases: before.leases}
			// A grant of a round closed since is dropped from the file by the next one.
			closed := &gossip.Leases{Experiment: grant.Experiment, Round: fetchRound - 1, Base: before.base.Bytes(), Issuer: "A",
				Deadline: grant.Deadline, Leases: []lease.Lease{{Round: fetchRound - 1, Base: before.base.Bytes(), Trainer: "t2",
					Microshards: []uint32{9}, Issuer: "A", Expiry: 1}}}
			before.v.keepGrant(closed, fetchRound-2)
			before.v.keepGrant(grant, fetchRound-1)
			require.Len(t, before.v.ownGrants, 1)
			tc.file(t, filepath.Join(dir, GrantsFile))

			// The restarted leader, which granted the round anew: t1's new lease differs.
			after := newLeasedRound(t, "t0", "t1")
			require.NotEqual(t, before.leases[0].ID(), after.leases[1].ID())
			after.v.Config.Node.StoreDir = dir
			after.v.restoreGrants()
			after.v.accept(after.r, "t1", before.contribution(before.leases[0]))
			if tc.late {
				require.Equal(t, map[string]uint64{"late": 1}, rejections(after.v))
				require.Empty(t, after.r.book.Barred(), "t1 may still report on its lease of the new grant")
				require.False(t, after.v.quarantine.Struck("t1", fetchRound))
				return
			}
			require.Equal(t, map[string]string{"t1": reasonUnknownLease}, after.r.book.Barred())
		})
	}
}

// A grant read back must be this validator's and of its experiment.
func TestRestoreGrantsKeepsOwnOpenRounds(t *testing.T) {
	f := newLeasedRound(t, "t1")
	f.v.Config.Node.StoreDir = t.TempDir()
	mk := func(round uint64, issuer, experiment string) *gossip.Leases {
		return &gossip.Leases{Experiment: experiment, Round: round, Base: f.base.Bytes(), Issuer: issuer,
			Deadline: time.Now().UnixMilli(), Leases: []lease.Lease{{Round: round, Base: f.base.Bytes(), Trainer: "t1",
				Microshards: []uint32{1}, Issuer: issuer, Expiry: 1}}}
	}
	exp := f.v.Config.Experiment.ID
	f.v.ownGrants = []*gossip.Leases{mk(3, "A", exp), mk(5, "B", exp), mk(5, "A", "another")}
	f.v.keepGrant(mk(5, "A", exp), 2)
	again := newLeasedRound(t)
	again.v.Config.Node.StoreDir = f.v.Config.Node.StoreDir
	again.v.restoreGrants()
	require.Len(t, again.v.ownGrants, 2, "its own grants of rounds 3 and 5: the other issuer's and experiment's are skipped")
}
