package pyruntime

import (
	"context"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/p2pnode/p2pnode/internal/testenv"
)

const charLM = "p2ptrain.workloads.charlm:CharLM"

// tinyLM is a small configuration of the char-level LM workload.
var tinyLM = map[string]any{"corpus_bytes": 60000, "shard_bytes": 16384, "eval_bytes": 4000, "hidden": 64, "embed": 16}

// A worker on the CPU reports the device's name and memory (shown in /status), and a
// precision the device cannot run fails at hello naming workload.precision.
func TestWorkerReportsItsDeviceAndRefusesFP16OnCPU(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	opts, _ := baseOptions(t, tinyFactory, nil)
	w, info := startWorker(t, opts)
	st := w.Status()
	if info.Device != "cpu" || info.Precision != "fp32" || st.DeviceName == "" || st.DeviceMemory <= 0 {
		t.Fatalf("info %+v, status %+v: want device cpu, fp32, a device name and memory", info, st)
	}

	opts, _ = baseOptions(t, tinyFactory, nil)
	opts.Precision = "fp16"
	bad, err := NewWorker(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()
	_, err = bad.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "workload.precision 'fp16' needs a CUDA device") {
		t.Fatalf("fp16 on the CPU: got %v", err)
	}
}

// The tiny LM trains through the worker on CUDA in fp32, bf16 and fp16. Skipped where
// torch sees no GPU (these development machines, CI), also under CI=true.
func TestWorkerTrainsTinyLMOnCUDA(t *testing.T) {
	requireTorch(t)
	if err := exec.Command(testInterpreter(), "-c", "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)").Run(); err != nil {
		testenv.NoGPU(t, "%s: torch.cuda.is_available() is false", testInterpreter())
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	data := t.TempDir()
	opts, _ := baseOptions(t, charLM, tinyLM)
	if err := PrepareDataset(ctx, opts, data); err != nil {
		t.Fatal(err)
	}
	shards, _ := filepath.Glob(filepath.Join(data, "shard-*.txt"))
	sort.Strings(shards)
	for _, precision := range []string{"fp32", "bf16", "fp16"} {
		t.Run(precision, func(t *testing.T) {
			opts, _ := baseOptions(t, charLM, tinyLM)
			opts.Device, opts.Precision = "cuda:0", precision
			w, info := startWorker(t, opts)
			st := w.Status()
			if info.Device != "cuda:0" || st.DeviceName == "" || st.DeviceMemory < 1<<30 || st.Precision != precision {
				t.Fatalf("info %+v, status %+v", info, st)
			}
			dir := w.ScratchDir()
			genesis := filepath.Join(dir, "genesis.safetensors")
			if err := w.Init(ctx, 1, genesis); err != nil {
				t.Fatal(err)
			}
			before, err := w.Evaluate(ctx, genesis)
			if err != nil {
				t.Fatal(err)
			}
			res, err := w.Train(ctx, TrainJob{Base: genesis, Shards: shards, Steps: 60, Seed: 1,
				Out: filepath.Join(dir, "local.safetensors")})
			if err != nil {
				t.Fatal(err)
			}
			after, err := w.Evaluate(ctx, filepath.Join(dir, "local.safetensors"))
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s on %s (%.1f GiB): held-out loss %.3f -> %.3f, %.0f samples/s, peak %.1f MiB",
				precision, st.DeviceName, float64(st.DeviceMemory)/(1<<30), before["loss"], after["loss"],
				res.Metrics["samples_per_second"], res.Metrics["device_max_memory_allocated_bytes"]/(1<<20))
			if !(after["loss"] < before["loss"]-0.5) {
				t.Fatalf("%s: held-out loss %.3f -> %.3f", precision, before["loss"], after["loss"])
			}
		})
	}
}

// workload.device: cuda on a machine without a GPU fails at start-up, naming the setting.
func TestWorkerRefusesCUDAWithoutAGPU(t *testing.T) {
	t.Parallel()
	requireTorch(t)
	if exec.Command(testInterpreter(), "-c", "import sys, torch; sys.exit(1 if torch.cuda.is_available() else 0)").Run() != nil {
		t.Skip("this machine has a GPU")
	}
	opts, _ := baseOptions(t, tinyFactory, nil)
	opts.Device = "cuda"
	w, err := NewWorker(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	_, err = w.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "workload.device 'cuda' requested but torch.cuda.is_available() is false") {
		t.Fatalf("cuda without a GPU: got %v", err)
	}
}
