package invite

import (
	"context"
	"log/slog"
	"testing"

	mocknet "github.com/libp2p/go-libp2p/p2p/net/mock"
	ma "github.com/multiformats/go-multiaddr"
	"github.com/stretchr/testify/require"
)

func TestServeAndFetchOverLibp2p(t *testing.T) {
	mn := mocknet.New()
	t.Cleanup(func() { mn.Close() })
	key, _ := newKey(t)
	owner, err := mn.AddPeer(key, ma.StringCast("/ip4/198.18.0.1/tcp/4001"))
	require.NoError(t, err)
	volunteer, err := mn.GenPeer()
	require.NoError(t, err)
	require.NoError(t, mn.LinkAll())

	exp, err := Experiment(ownerConfig(), owner.ID().String())
	require.NoError(t, err)
	r, err := Sign(key, exp)
	require.NoError(t, err)
	s, err := Serve(owner, r, slog.New(slog.DiscardHandler))
	require.NoError(t, err)

	got, err := Fetch(context.Background(), volunteer, owner.ID())
	require.NoError(t, err)
	j, err := Verify(got, owner.ID())
	require.NoError(t, err)
	require.Equal(t, ID(exp), j.ID)

	s.Close()
	_, err = Fetch(context.Background(), volunteer, owner.ID())
	require.ErrorContains(t, err, "fetch experiment record from "+owner.ID().String())
}
