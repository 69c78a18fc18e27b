package credit

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
)

func head(round uint64, merged ...chain.Contribution) *chain.Head {
	return &chain.Head{Round: round, Contributions: merged}
}

func merged(peer string, samples uint64) chain.Contribution {
	return chain.Contribution{Peer: peer, Samples: samples}
}

func TestLedger(t *testing.T) {
	type step struct {
		h *chain.Head
		n *chain.Notes
	}
	for _, tc := range []struct {
		name  string
		steps []step
		want  map[string]Account
		order []string
	}{
		{
			name: "merges add up per peer",
			steps: []step{
				{head(1, merged("a", 10), merged("b", 20)), nil},
				{head(2, merged("a", 10)), nil},
			},
			want: map[string]Account{
				"a": {Peer: "a", Merged: 2, Samples: 20, First: 1, Last: 2},
				"b": {Peer: "b", Merged: 1, Samples: 20, First: 1, Last: 1},
			},
			order: []string{"a", "b"},
		},
		{
			name: "rejections by reason and quarantines from the notes",
			steps: []step{
				{head(5, merged("a", 10)), &chain.Notes{Round: 5, Rejected: 3, Rejections: []chain.Rejection{
					{Peer: "b", Reason: "norm_outlier"}, {Peer: "b", Reason: "norm_outlier"}, {Peer: "c", Reason: "late"}}}},
				{head(6, merged("b", 7)), &chain.Notes{Round: 6, Rejected: 1, Rejections: []chain.Rejection{{Peer: "c", Reason: "low_cosine"}},
					Quarantined: []chain.Quarantine{{Peer: "c", Until: 11}}}},
				// The same quarantine listed again by the next round's notes is one quarantine.
				{head(7), &chain.Notes{Round: 7, Quarantined: []chain.Quarantine{{Peer: "c", Until: 11}}}},
				{head(20), &chain.Notes{Round: 20, Quarantined: []chain.Quarantine{{Peer: "c", Until: 25}}}},
			},
			want: map[string]Account{
				"a": {Peer: "a", Merged: 1, Samples: 10, First: 5, Last: 5},
				"b": {Peer: "b", Merged: 1, Samples: 7, Rejected: map[string]int{"norm_outlier": 2}, First: 5, Last: 6},
				"c": {Peer: "c", Rejected: map[string]int{"late": 1, "low_cosine": 1}, Quarantines: 2, QuarantinedUntil: 25, First: 5, Last: 6},
			},
			order: []string{"a", "b", "c"},
		},
		{
			name: "heads added newest first count the same",
			steps: []step{
				{head(3, merged("a", 1)), nil},
				{head(2), &chain.Notes{Round: 2, Rejected: 1, Rejections: []chain.Rejection{{Peer: "a", Reason: "late"}}}},
				{head(1, merged("a", 1)), nil},
			},
			want:  map[string]Account{"a": {Peer: "a", Merged: 2, Samples: 2, Rejected: map[string]int{"late": 1}, First: 1, Last: 3}},
			order: []string{"a"},
		},
		{
			name: "notes for another round are not this head's",
			steps: []step{
				{head(3, merged("a", 1)), &chain.Notes{Round: 4, Rejected: 1, Rejections: []chain.Rejection{{Peer: "a", Reason: "late"}}}},
			},
			want:  map[string]Account{"a": {Peer: "a", Merged: 1, Samples: 1, First: 3, Last: 3}},
			order: []string{"a"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var l Ledger
			for _, s := range tc.steps {
				l.Add(s.h, s.n)
			}
			var order []string
			for _, a := range l.Accounts() {
				order = append(order, a.Peer)
				require.Equal(t, tc.want[a.Peer], a, a.Peer)
				require.Equal(t, tc.want[a.Peer], l.Account(a.Peer))
			}
			require.Equal(t, tc.order, order)
			require.Equal(t, Account{Peer: "nobody"}, l.Account("nobody"))
		})
	}
}

func TestSummary(t *testing.T) {
	a := Account{Merged: 12, Samples: 3840, Rejected: map[string]int{"norm_outlier": 2, "late": 1}, QuarantinedUntil: 105}
	require.Equal(t, "merged 12 (3840 samples), rejected 3 (norm_outlier ×2, late), quarantined until round 105", a.Summary(100))
	require.Equal(t, "merged 12 (3840 samples), rejected 3 (norm_outlier ×2, late)", a.Summary(106), "the quarantine is over")
	require.Equal(t, "merged 0 (0 samples), rejected 0", (&Account{}).Summary(1))
}

func TestWriteTable(t *testing.T) {
	var l Ledger
	l.Add(head(1, merged("peerA", 64), merged("peerB", 64)), &chain.Notes{Round: 1, Rejected: 1,
		Rejections: []chain.Rejection{{Peer: "peerC", Reason: "norm_outlier"}}, Quarantined: []chain.Quarantine{{Peer: "peerC", Until: 6}}})
	l.Add(head(2, merged("peerA", 64)), nil)
	var b bytes.Buffer
	require.NoError(t, WriteTable(&b, l.Accounts(), l.Round, "peerB"))
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	require.Len(t, lines, 5, b.String())
	require.Regexp(t, `^peerA +2 +128 +0 +1–2 +- +-`, lines[1])
	require.Regexp(t, `^peerB \(this node\) +1 +64 +0 +1–1 +- +-`, lines[2])
	require.Regexp(t, `^peerC +0 +0 +1 +1–1 +until round 6 +norm_outlier`, lines[3])
	require.Regexp(t, `^3 peers, through round 2 +3 +192 +1 +1 quarantines +norm_outlier$`, lines[4])

	// Nothing rejected: the total's reasons say so, and no line ends in padding.
	var clean Ledger
	clean.Add(head(1, merged("peerA", 64)), nil)
	b.Reset()
	require.NoError(t, WriteTable(&b, clean.Accounts(), clean.Round, ""))
	lines = strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	require.Regexp(t, `^1 peers, through round 1 +1 +64 +0 +0 quarantines +-$`, lines[len(lines)-1])
	for _, line := range lines {
		require.Equal(t, strings.TrimRight(line, " "), line, "trailing spaces")
	}
}

func TestTeller(t *testing.T) {
	rej := func(round uint64, peers ...string) *chain.Notes {
		n := &chain.Notes{Round: round, Sig: chain.Signature{Peer: "v"}}
		for _, p := range peers {
			n.Rejections = append(n.Rejections, chain.Rejection{Peer: p, Reason: "norm_outlier"})
			n.Rejected++
		}
		return n
	}
	quar := func(n *chain.Notes, peer string, until uint64) *chain.Notes {
		n.Quarantined = append(n.Quarantined, chain.Quarantine{Peer: peer, Until: until})
		return n
	}
	tl := NewTeller("me", 10)
	require.Empty(t, tl.Notes(rej(9, "me")), "rounds before the teller started are history")
	require.Empty(t, tl.Notes(rej(11, "other")), "another peer's rejection")
	got := tl.Notes(rej(12, "me", "other", "me"))
	require.Equal(t, []Event{{Kind: EventRejected, Round: 12, Reason: "norm_outlier", Count: 2, By: "v"}}, got)
	require.Contains(t, got[0].String(), "2 contributions to round 12 rejected: norm_outlier (the update is much larger")
	require.Empty(t, tl.Notes(rej(12, "me")), "the round's notes again (held-out metrics came)")

	got = tl.Notes(quar(rej(13, "me"), "me", 18))
	require.Equal(t, []Event{
		{Kind: EventRejected, Round: 13, Reason: "norm_outlier", Count: 1, By: "v"},
		{Kind: EventQuarantined, Round: 13, Until: 18, By: "v"},
	}, got)
	require.Equal(t, "quarantined through round 18: no leases until then, after repeated rejections or missed leases", got[1].String())
	require.Empty(t, tl.Notes(quar(rej(14), "me", 18)), "the same quarantine listed again")
	require.Empty(t, tl.Notes(rej(18)))
	got = tl.Notes(rej(19))
	require.Equal(t, []Event{{Kind: EventReleased, Round: 19, Until: 18, By: "v"}}, got)
	require.Equal(t, "quarantine over (it ended with round 18): leases again", got[0].String())
	require.Empty(t, tl.Notes(rej(20)))
	require.Empty(t, tl.Notes(nil))
	require.Equal(t, "the validator's reason; see docs/security.md", Meaning("something new"))
}
