package lease

import "testing"

// The id of a fixed lease: pins its canonical encoding.
func TestGoldenLeaseID(t *testing.T) {
	l := &Lease{Round: 5, Base: []byte{1, 2, 3}, Trainer: "t", Microshards: []uint32{0, 7, 1000}, Expiry: 1700000000123, Issuer: "v", Epoch: 1, Steps: 40}
	if got, want := l.ID().String(), "bafireidzxagap2eabck6uhhc7si2nt3mr5cxgv43kze67jintxf3ygjw3i"; got != want {
		t.Errorf("lease id %s, want %s: the lease encoding changed", got, want)
	}
}
