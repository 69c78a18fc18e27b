package pyruntime

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/p2pnode/p2pnode/internal/testenv"
)

// smallTmpfs mounts a tmpfs of size bytes at a fresh directory (root only) and unmounts it
// when the test ends: a real file system that is too small, as a container's /dev/shm is.
func smallTmpfs(t *testing.T, size string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		testenv.Missing(t, "cannot mount a %s tmpfs (needs root): %v %s", size, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", dir).Run() })
	return dir
}

func TestFitScratch(t *testing.T) {
	small := smallTmpfs(t, "1m")         // 1 MiB
	middle := smallTmpfs(t, "4m")        // 4 MiB
	const fits, tooBig = 10_000, 100_000 // 200 KB and 2 MB of packs
	cases := []struct {
		name         string
		dir          string
		params       int64
		fallback     string
		wantSwitched bool
		wantErr      string
	}{
		{"fits", small, fits, middle, false, ""},
		{"too small, fallback", small, tooBig, middle, true, ""},
		{"too small, no fallback", small, tooBig, "", false, ""},
		{"fallback too small too", small, 1_000_000, middle, false, "need 19.1 MiB"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := fitScratch(tc.dir, tc.params, tc.fallback)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), tc.dir) ||
					!strings.Contains(err.Error(), tc.fallback) {
					t.Fatalf("err = %v, want one naming %q, %s and %s", err, tc.wantErr, tc.dir, tc.fallback)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.switched != tc.wantSwitched {
				t.Fatalf("switched = %v, want %v (need %d, free %d)", c.switched, tc.wantSwitched, c.need, c.free)
			}
			if c.switched {
				if filepath.Dir(c.dir) != tc.fallback || !c.own {
					t.Fatalf("dir %s (own %v), want a fresh owned directory under %s", c.dir, c.own, tc.fallback)
				}
				removeScratch(c.dir)
			} else if c.dir != tc.dir {
				t.Fatalf("dir %s, want %s kept", c.dir, tc.dir)
			}
			if c.need != 20*tc.params {
				t.Fatalf("need %d, want %d", c.need, 20*tc.params)
			}
		})
	}
}

// TestWorkerFallsBackToDiskScratch: a worker whose packs do not fit in its (1 MiB) scratch
// tmpfs moves to the disk scratch dir at start, says so once with both sizes, trains there,
// and removes that directory on Close.
func TestWorkerFallsBackToDiskScratch(t *testing.T) {
	requireTorch(t)
	tmpfs := smallTmpfs(t, "1m")
	disk := filepath.Join(t.TempDir(), "store", "scratch")
	opts, logs := baseOptions(t, "p2ptrain.workloads.bench:Bench", map[string]any{"params": 200_000, "width": 256})
	opts.ScratchDir, opts.DiskScratchDir = tmpfs, disk
	w, err := NewWorker(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := w.Start(ctx); err != nil {
		t.Fatal(err)
	}
	scratch := w.ScratchDir()
	if filepath.Dir(scratch) != disk {
		t.Fatalf("scratch %s, want a directory under %s", scratch, disk)
	}
	if n := strings.Count(logs.String(), "scratch dir too small"); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, logs.String())
	}
	for _, want := range []string{"need=\"3.8 MiB\"", "free=\"1.0 MiB\"", tmpfs} {
		if !strings.Contains(logs.String(), want) {
			t.Fatalf("warning lacks %s:\n%s", want, logs.String())
		}
	}
	// A 800 KB pack would not fit next to its optimizer state in the tmpfs; on disk it does.
	out := filepath.Join(scratch, "init.safetensors")
	if err := w.Init(ctx, 1, out); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(out); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(scratch); !os.IsNotExist(err) {
		t.Fatalf("scratch %s still there after Close (%v)", scratch, err)
	}
	if _, err := os.Stat(tmpfs); err != nil {
		t.Fatalf("the given scratch dir %s was removed: %v", tmpfs, err)
	}
}
