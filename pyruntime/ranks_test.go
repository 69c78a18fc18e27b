package pyruntime

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A worker with two ranks on the CPU (gloo): one worker to the node, a rank per process,
// every rank's samples in the result, and a rank killed mid-window failing that window
// only: the worker process stays, its ranks are restarted, and the next window trains.
func TestWorkerRanksOnCPU(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	once := filepath.Join(t.TempDir(), "hung")
	opts, lb := baseOptions(t, faultyFactory, map[string]any{"fault": "hang", "at_step": 2, "rank": 1, "once_file": once})
	opts.Ranks = 2
	opts.RankTimeout = 60 * time.Second
	w, info := startWorker(t, opts)
	if info.Ranks != 2 || len(info.Devices) != 2 || info.Shard != "ddp" {
		t.Fatalf("hello: ranks %d, devices %+v, shard %q", info.Ranks, info.Devices, info.Shard)
	}
	victim := info.Devices[1].PID
	if victim == 0 || victim == info.PID || info.Devices[0].PID == victim {
		t.Fatalf("rank pids %+v, worker %d", info.Devices, info.PID)
	}
	ctx := context.Background()
	job := TrainJob{Shards: []string{"unused"}, Steps: 5, Out: filepath.Join(w.ScratchDir(), "out.safetensors")}

	done := make(chan error, 1)
	go func() { _, err := w.Train(ctx, job); done <- err }()
	deadline := time.Now().Add(time.Minute)
	for !strings.Contains(lb.String(), "hanging on purpose") {
		if time.Now().After(deadline) {
			t.Fatal("rank 1 never reached its hang")
		}
		time.Sleep(20 * time.Millisecond)
	}
	killedAt := time.Now()
	if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	err := <-done
	if !errors.Is(err, ErrRankFailed) {
		t.Fatalf("want ErrRankFailed, got %v", err)
	}
	took := time.Since(killedAt)
	if took > 10*time.Second {
		t.Fatalf("the window failed %s after the rank died", took)
	}
	t.Logf("the window failed %s after rank 1 was killed: %v", took.Round(time.Millisecond), err)
	for _, want := range []string{"rank 1 (cpu", fmt.Sprintf("pid %d", victim), "killed by signal 9", "restarted"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	res, err := w.Train(ctx, job)
	if err != nil {
		t.Fatalf("after the ranks restarted: %v", err)
	}
	if res.Samples != 5*2*16 || len(res.Ranks) != 2 || res.IdleRanks != 0 {
		t.Fatalf("result: samples %d, ranks %+v, idle %d", res.Samples, res.Ranks, res.IdleRanks)
	}
	st := w.Status()
	if st.Restarts != 0 || st.PID != info.PID {
		t.Fatalf("the worker process itself was restarted: %+v", st)
	}
	if st.Ranks != 2 || st.RankRestarts != 1 || len(st.Devices) != 2 || st.Devices[1].PID == victim || st.Devices[1].PeakRSS <= 0 {
		t.Fatalf("status: ranks %d, rank restarts %d, devices %+v", st.Ranks, st.RankRestarts, st.Devices)
	}
}

// What the machine cannot run is refused when the worker starts, naming the field.
func TestWorkerRanksRefusedAtStart(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	for _, tc := range []struct {
		name string
		edit func(*Options)
		want string
	}{
		{"a GPU this machine lacks", func(o *Options) { o.Device = "auto"; o.Devices = []string{"cuda:0", "cuda:7"} }, "workload.devices"},
		{"ranks on a GPU", func(o *Options) { o.Device = "cuda:0"; o.Ranks = 2 }, "workload.ranks"},
		{"fsdp on one device", func(o *Options) { o.Shard = "fsdp" }, "workload.shard fsdp"},
		{"checkpointing without blocks", func(o *Options) { o.ActivationCheckpointing = true }, "workload.activation_checkpointing"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts, _ := baseOptions(t, tinyFactory, nil)
			tc.edit(&opts)
			w, err := NewWorker(opts)
			if err != nil {
				t.Fatal(err)
			}
			defer w.Close()
			_, err = w.Start(context.Background())
			if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want a BadRequest naming %s, got %v", tc.want, err)
			}
		})
	}
}

// A lease with fewer batches than ranks (here one batch a pass, two ranks) trains on one
// rank; the other sits the window out, and the node warns once, not every window.
func TestWorkerRanksIdleWarnsOnce(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	opts, lb := baseOptions(t, tinyFactory, map[string]any{"batch_size": 256})
	opts.Ranks = 2
	w, _ := startWorker(t, opts)
	job := TrainJob{Shards: []string{"unused"}, Steps: 3, Out: filepath.Join(w.ScratchDir(), "out.safetensors")}
	for range 2 {
		res, err := w.Train(context.Background(), job)
		if err != nil {
			t.Fatal(err)
		}
		if res.IdleRanks != 1 || res.Samples != 3*256 || !res.Ranks[1].Idle {
			t.Fatalf("idle ranks %d, samples %d, ranks %+v", res.IdleRanks, res.Samples, res.Ranks)
		}
	}
	if n := strings.Count(lb.String(), "fewer batches than the worker has ranks"); n != 1 {
		t.Fatalf("warned %d times, want once:\n%s", n, lb.String())
	}
	if st := w.Status(); len(st.Devices) != 2 || !st.Devices[1].Idle {
		t.Fatalf("status devices %+v", st.Devices)
	}
}
