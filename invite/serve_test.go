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

	got, sizes, err := Fetch(context.Background(), volunteer, owner.ID())
	require.NoError(t, err)
	require.Nil(t, sizes, "no sizes set: none sent")
	j, err := Verify(got, owner.ID())
	require.NoError(t, err)
	require.Equal(t, ID(exp), j.ID)

	want := Sizes{Round: 12, Params: 1_000_000, ParamsBytes: 4_000_512, DatasetBytes: 9 << 20, DatasetFiles: 3}
	known := false
	s.SetSizes(func() (Sizes, bool) { return want, known })
	_, sizes, err = Fetch(context.Background(), volunteer, owner.ID())
	require.NoError(t, err)
	require.Nil(t, sizes, "the server knows nothing yet: none sent")
	known = true
	got, sizes, err = Fetch(context.Background(), volunteer, owner.ID())
	require.NoError(t, err)
	require.Equal(t, &want, sizes)
	_, err = Verify(got, owner.ID())
	require.NoError(t, err)

	s.Close()
	_, _, err = Fetch(context.Background(), volunteer, owner.ID())
	require.ErrorContains(t, err, "fetch experiment record from "+owner.ID().String())
}

func TestDecodeSizesRefusesBadBytes(t *testing.T) {
	good, err := EncodeSizes(Sizes{Round: 1, Params: 10, ParamsBytes: 40})
	require.NoError(t, err)
	neg, err := EncodeSizes(Sizes{Params: -1})
	require.NoError(t, err)
	for _, tc := range []struct {
		name string
		b    []byte
		says string
	}{
		{"trailing bytes", append(append([]byte(nil), good...), 0), "bytes after them"},
		{"too long", make([]byte, MaxSizesBytes+1), "exceeds"},
		{"not cbor", []byte{0xff}, "sizes:"},
		{"negative count", neg, "negative parameter count"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeSizes(tc.b)
			require.ErrorContains(t, err, tc.says)
		})
	}
	s, err := DecodeSizes(good)
	require.NoError(t, err)
	require.Equal(t, Sizes{Round: 1, Params: 10, ParamsBytes: 40}, *s)
}
