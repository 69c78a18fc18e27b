package dataset

import (
	"strings"
	"testing"
)

// FuzzLoadManifest feeds arbitrary bytes to the manifest decoder: it must never panic, and
// anything it accepts must survive a canonical round trip with the same id.
func FuzzLoadManifest(f *testing.F) {
	good, _ := validManifest().Canonical()
	f.Add(good)
	f.Add([]byte(`{"version":1,"name":"x","files":[]}`))
	f.Add([]byte(`{"version":1,"name":"x","files":[{"path":"../a","bytes":1,"examples":0,"cid":"x"}]}`))
	f.Add([]byte(`{"version":1,"name":"x","files":null}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := Decode(b)
		if err != nil {
			return
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("Decode accepted an invalid manifest: %v", err)
		}
		id, err := m.ID()
		if err != nil {
			t.Fatal(err)
		}
		canon, err := m.Canonical()
		if err != nil {
			t.Fatal(err)
		}
		again, err := Decode(canon)
		if err != nil {
			t.Fatalf("canonical form does not decode: %v", err)
		}
		id2, _ := again.ID()
		if !id.Equals(id2) {
			t.Fatalf("id changed across canonical round trip: %s → %s", id, id2)
		}
		// One microshard cannot collide with another, so that plan must succeed; smaller
		// targets may fail only on duplicate contents.
		if _, err := NewPlan(m, 1<<62); err != nil {
			t.Fatalf("single-shard plan failed: %v", err)
		}
		if _, err := NewPlan(m, 1+int64(len(b))); err != nil && !strings.Contains(err.Error(), "identical contents") {
			t.Fatalf("plan failed: %v", err)
		}
	})
}
