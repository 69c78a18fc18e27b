package validator

import (
	"slices"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/chain"
)

func TestReferenceShardsAreTheRoundsOwn(t *testing.T) {
	a := &chain.Head{Round: 4, Params: []byte("params of head 4")}
	b := &chain.Head{Round: 5, Params: []byte("params of head 5")}
	got := ReferenceShards(a, 100, 6)
	require.Equal(t, got, ReferenceShards(a, 100, 6), "every validator draws the same")
	require.NotEqual(t, got, ReferenceShards(b, 100, 6), "each base draws its own")
	require.Len(t, got, 6)
	require.True(t, slices.IsSorted(got))
	require.Len(t, slices.Compact(slices.Clone(got)), 6, "distinct")
	for _, s := range got {
		require.Less(t, s, uint32(100))
	}
	require.Len(t, ReferenceShards(a, 3, 6), 3, "no more than the plan holds")
	require.Empty(t, ReferenceShards(a, 0, 6))
}
