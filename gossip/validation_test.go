package gossip

import (
	"context"
	"crypto/rand"
	"testing"
	"time"

	pubsub "github.com/libp2p/go-libp2p-pubsub"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
)

// attack is the cast of one forged-message case: an honest validator, trainer and observer
// running Gossip, and an attacker host running a bare GossipSub. The attacker is in the
// validator set (a rogue validator), so the cases reach the deeper checks; outsider is a
// key it holds that is in no set.
type attack struct {
	val, trainer, attacker peer.ID
	valKey, attackerKey    crypto.PrivKey
	outsider               crypto.PrivKey
}

func (a *attack) head(t testing.TB, h *chain.Head, signers ...crypto.PrivKey) []byte {
	m, _ := signedHead(t, h, signers...)
	return encode(t, m)
}

func TestForgedAndMalformedNeverDelivered(t *testing.T) {
	const self, outsider = "attacker", "outsider"
	cases := []struct {
		name   string
		kind   Kind
		author string // self: the attacker's own key; outsider: a key in no validator set
		data   func(t testing.TB, a *attack) []byte
		result string // counted at every honest node; "" for messages pubsub drops itself
		reason string
		opts   []pubsub.Option // the attacker's pubsub
	}{
		{"head from a non-validator", KindHeads, outsider, func(t testing.TB, a *attack) []byte {
			return a.head(t, fixChainHead(1, 1), a.outsider)
		}, "reject", reasonNotValidator, nil},
		{"head with a forged signature", KindHeads, self, func(t testing.TB, a *attack) []byte {
			m, _ := signedHead(t, fixChainHead(1, 1), a.attackerKey)
			forged := make([]byte, 64)
			_, _ = rand.Read(forged)
			m.Signed.Add(chain.Signature{Peer: a.val.String(), Sig: forged})
			return encode(t, m)
		}, "reject", reasonBadSignature, nil},
		{"head not signed by its publisher", KindHeads, self, func(t testing.TB, a *attack) []byte {
			return a.head(t, fixChainHead(1, 1), a.valKey)
		}, "reject", reasonNoAuthorSig, nil},
		{"head of another experiment", KindHeads, self, func(t testing.TB, a *attack) []byte {
			h := fixChainHead(1, 1)
			h.Experiment = "other"
			return a.head(t, h, a.attackerKey)
		}, "reject", reasonWrongExperiment, nil},
		{"garbage on heads", KindHeads, self, func(testing.TB, *attack) []byte {
			return []byte("\xa1\x01\xff not cbor at all")
		}, "reject", reasonMalformed, nil},
		{"contribution naming another peer", KindContributions, self, func(t testing.TB, a *attack) []byte {
			return encode(t, fixContribution(a.trainer, 1))
		}, "reject", reasonAuthorMismatch, nil},
		{"contribution of another experiment", KindContributions, self, func(t testing.TB, a *attack) []byte {
			c := fixContribution(a.attacker, 1)
			c.Experiment = "other"
			return encode(t, c)
		}, "reject", reasonWrongExperiment, nil},
		{"garbage on contributions", KindContributions, self, func(testing.TB, *attack) []byte {
			return []byte{0xff, 0x00, 0x13, 0x37}
		}, "reject", reasonMalformed, nil},
		{"release naming another peer", KindReleases, self, func(t testing.TB, a *attack) []byte {
			return encode(t, &Release{Experiment: testExp, Round: 1, Base: fixBase, Lease: fixLease, Peer: a.trainer.String()})
		}, "reject", reasonAuthorMismatch, nil},
		{"garbage on releases", KindReleases, self, func(testing.TB, *attack) []byte {
			return []byte{0xff, 0x00, 0x13, 0x37}
		}, "reject", reasonMalformed, nil},
		{"announce naming another peer", KindPeers, self, func(t testing.TB, a *attack) []byte {
			return encode(t, fixAnnounce(a.trainer, time.Now()))
		}, "reject", reasonAuthorMismatch, nil},
		{"oversized announce", KindPeers, self, func(testing.TB, *attack) []byte {
			return make([]byte, MaxAnnounceBytes+1)
		}, "reject", reasonTooLarge, nil},
		{"leases from a non-validator", KindLeases, outsider, func(t testing.TB, a *attack) []byte {
			id, _ := peer.IDFromPrivateKey(a.outsider)
			return encode(t, fixLeases(id, a.trainer, time.Now().Add(time.Minute)))
		}, "reject", reasonNotValidator, nil},
		{"leases naming another issuer", KindLeases, self, func(t testing.TB, a *attack) []byte {
			return encode(t, fixLeases(a.val, a.trainer, time.Now().Add(time.Minute)))
		}, "reject", reasonAuthorMismatch, nil},
		{"attestation signed by another validator", KindAttestations, self, func(t testing.TB, a *attack) []byte {
			_, id := signedHead(t, fixChainHead(1, 0), a.valKey)
			return encode(t, fixAttestation(t, a.valKey, id))
		}, "reject", reasonAuthorMismatch, nil},
		{"attestation with a bad signature", KindAttestations, self, func(t testing.TB, a *attack) []byte {
			_, id := signedHead(t, fixChainHead(1, 0), a.valKey)
			m := fixAttestation(t, a.attackerKey, id)
			m.Sig.Sig[0] ^= 0xff
			return encode(t, m)
		}, "reject", reasonBadSignature, nil},
		{"stale announce", KindPeers, self, func(t testing.TB, a *attack) []byte {
			return encode(t, fixAnnounce(a.attacker, time.Now().Add(-10*time.Minute)))
		}, "ignore", reasonStale, nil},
		{"announce from the future", KindPeers, self, func(t testing.TB, a *attack) []byte {
			return encode(t, fixAnnounce(a.attacker, time.Now().Add(10*time.Minute)))
		}, "ignore", reasonStale, nil},
		{"expired leases", KindLeases, self, func(t testing.TB, a *attack) []byte {
			return encode(t, fixLeases(a.attacker, a.trainer, time.Now().Add(-10*time.Minute)))
		}, "ignore", reasonStale, nil},
		{"unsigned message", KindContributions, self, func(t testing.TB, a *attack) []byte {
			return encode(t, fixContribution(a.attacker, 1))
		}, "", "", []pubsub.Option{pubsub.WithMessageSignaturePolicy(pubsub.StrictNoSign)}},
		{"message over the wire limit", KindHeads, self, func(testing.TB, *attack) []byte {
			return make([]byte, maxTopicBytes()+envelopeBytes+1)
		}, "", "", []pubsub.Option{pubsub.WithMaxMessageSize(16 << 20)}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mn, hosts := fullMesh(t, 4)
			a := &attack{val: hosts[0].ID(), trainer: hosts[1].ID(), attacker: hosts[3].ID(),
				valKey: privKey(t, hosts[0]), attackerKey: privKey(t, hosts[3])}
			var err error
			a.outsider, _, err = crypto.GenerateEd25519Key(rand.Reader)
			require.NoError(t, err)
			honest := startNodes(t, hosts[:3], []peer.ID{a.val, a.attacker}, nil)
			raw := newRawPeer(t, hosts[3], append([]pubsub.Option{pubsub.WithFloodPublish(true)}, tc.opts...)...)
			connectAll(t, mn)
			waitTopicPeers(t, honest, func(int) int { return 3 })
			raw.waitPeers(t, 3)

			var pubOpts []pubsub.PubOpt
			if tc.author == outsider {
				id, err := peer.IDFromPrivateKey(a.outsider)
				require.NoError(t, err)
				pubOpts = append(pubOpts, pubsub.WithSecretKeyAndPeerId(a.outsider, id))
			}
			require.NoError(t, raw.topics[tc.kind].Publish(context.Background(), tc.data(t, a), pubOpts...))

			if tc.result != "" {
				for _, n := range honest {
					require.Eventually(t, func() bool {
						return counter(t, n.reg, "p2ptrain_gossip_messages_total",
							map[string]string{"topic": string(tc.kind), "result": tc.result, "reason": tc.reason}) >= 1
					}, 5*time.Second, 10*time.Millisecond, "honest node did not %s the message for %s", tc.result, tc.reason)
				}
			}
			for _, n := range honest {
				quiet(t, n, 200*time.Millisecond)
			}

			// The honest nodes carry on: a valid message still reaches all of them.
			c := fixContribution(a.trainer, 2)
			require.NoError(t, honest[1].Publish(context.Background(), c))
			for _, n := range honest {
				require.Equal(t, c, recv(t, n, 5*time.Second).Msg)
			}
		})
	}
}

// A copy of someone's message re-signed by another peer is rejected, and does not make the
// genuine message look like a duplicate when it arrives afterwards.
func TestForgedCopyDoesNotShadowGenuine(t *testing.T) {
	mn, hosts := fullMesh(t, 4)
	honest := startNodes(t, hosts[:3], []peer.ID{hosts[0].ID()}, nil)
	raw := newRawPeer(t, hosts[3], pubsub.WithFloodPublish(true))
	connectAll(t, mn)
	waitTopicPeers(t, honest, func(int) int { return 3 })
	raw.waitPeers(t, 3)

	c := fixContribution(hosts[1].ID(), 1)
	require.NoError(t, raw.topics[KindContributions].Publish(context.Background(), encode(t, c)))
	for _, n := range honest {
		require.Eventually(t, func() bool {
			return counter(t, n.reg, "p2ptrain_gossip_messages_total",
				map[string]string{"topic": "contributions", "result": "reject", "reason": reasonAuthorMismatch}) >= 1
		}, 5*time.Second, 10*time.Millisecond)
	}
	require.NoError(t, honest[1].Publish(context.Background(), c))
	for _, n := range honest {
		m := recv(t, n, 5*time.Second)
		require.Equal(t, hosts[1].ID(), m.From)
		require.Equal(t, c, m.Msg)
	}
}

// A validator that panics rejects the message instead of taking the node down.
func TestValidatorRecoversPanics(t *testing.T) {
	_, hosts := fullMesh(t, 1)
	n := startNodes(t, hosts, nil, nil)[0]
	res := n.validator(KindHeads)(context.Background(), hosts[0].ID(), nil) // nil message: GetFrom panics
	require.Equal(t, pubsub.ValidationReject, res)
	require.Equal(t, 1.0, counter(t, n.reg, "p2ptrain_gossip_messages_total",
		map[string]string{"topic": "heads", "result": "reject", "reason": reasonPanic}))
}

// Nothing a peer sends crashes the checks, on any topic, from any author.
func FuzzCheck(f *testing.F) {
	key, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		f.Fatal(err)
	}
	author, _ := peer.IDFromPrivateKey(key)
	c := &checker{network: testNet, experiment: testExp, maxSkew: time.Minute, now: time.Now}
	c.setValidators([]peer.ID{author})
	head, id := signedHead(f, fixChainHead(2, 1), key)
	for i, v := range []any{
		head, fixLeases(author, author, time.Now()), fixContribution(author, 1),
		fixAnnounce(author, time.Now()), fixAttestation(f, key, id),
	} {
		f.Add(uint8(i), encode(f, v))
	}
	f.Fuzz(func(t *testing.T, k uint8, data []byte) {
		v, o := c.check(kinds[int(k)%len(kinds)], author, data)
		if (v == nil) == (o == nil) {
			t.Fatalf("check returned value %v and outcome %v", v, o)
		}
	})
}
