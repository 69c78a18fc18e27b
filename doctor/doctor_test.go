package doctor

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/p2pnode/p2pnode/config"
)

// fakePython writes an executable that prints out as the probe's answer.
func fakePython(t *testing.T, out string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "python")
	require.NoError(t, os.WriteFile(p, []byte("#!/bin/sh\ncat <<'EOF'\n"+out+"\nEOF\n"), 0o755))
	return p
}

func machine(t *testing.T, nvidia bool, memKB string) Machine {
	t.Helper()
	dev := t.TempDir()
	if nvidia {
		require.NoError(t, os.WriteFile(filepath.Join(dev, "nvidia0"), nil, 0o644))
	}
	mem := filepath.Join(t.TempDir(), "meminfo")
	require.NoError(t, os.WriteFile(mem, []byte("MemTotal: 99999999 kB\nMemAvailable: "+memKB+" kB\n"), 0o644))
	return Machine{DevDir: dev, MemInfo: mem, ProbeTimeout: 30 * time.Second,
		LookPath: func(string) (string, error) { return "", errors.New("not found") }}
}

func find(t *testing.T, rs []Result, name string) Result {
	t.Helper()
	for _, r := range rs {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no %s check in %v", name, rs)
	return Result{}
}

const cpuTorch = `{"python": "3.11.2 at /x/python", "torch": "2.3.0", "cuda_build": "", "cuda": false, "numpy": "1.26"}`

func TestDoctorChecks(t *testing.T) {
	for _, tc := range []struct {
		name   string
		probe  string // "" = no interpreter at the path
		nvidia bool
		device string
		memKB  string
		check  string
		want   Status
		says   string
		fix    string
	}{
		{"no interpreter", "", false, "auto", "8000000", "interpreter", Fail, "does not run as Python 3", "workload.interpreter"},
		{"no torch", `{"python": "3.11 at /x/python", "torch_error": "ModuleNotFoundError: No module named 'torch'"}`, false, "auto", "8000000",
			"torch", Fail, "cannot import torch", "python3-torch"},
		{"no numpy", `{"python": "3.11 at /x/python", "torch": "2.3.0", "numpy_error": "ModuleNotFoundError: No module named 'numpy'"}`, false, "auto", "8000000",
			"torch", Fail, "cannot import numpy", "python3-numpy"},
		{"cpu machine", cpuTorch, false, "auto", "8000000", "device", OK, "the CPU (no GPU on this machine)", ""},
		{"gpu that torch cannot use", cpuTorch, true, "auto", "8000000", "device", Warn, "has an NVIDIA GPU", "CUDA build of torch"},
		{"cuda asked, none usable", cpuTorch, false, "cuda", "8000000", "device", Fail, "cannot use CUDA", "CUDA build of torch"},
		{"cuda", `{"python": "3.11 at /x/python", "torch": "2.3.0", "cuda_build": "12.1", "cuda": true, "gpus": ["NVIDIA H100"], "numpy": "1.26"}`, true, "auto", "8000000",
			"device", OK, "NVIDIA H100", ""},
		{"little memory", cpuTorch, false, "auto", "100000", "memory", Warn, "available", "smaller model"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Resolve(t.TempDir())
			cfg.Workload.Interpreter = filepath.Join(t.TempDir(), "missing-python")
			if tc.probe != "" {
				cfg.Workload.Interpreter = fakePython(t, tc.probe)
			}
			cfg.Workload.Device = tc.device
			rs := machine(t, tc.nvidia, tc.memKB).Run(context.Background(), cfg)
			r := find(t, rs, tc.check)
			require.Equal(t, tc.want, r.Status, r.Detail)
			require.Contains(t, r.Detail, tc.says)
			require.Contains(t, r.Fix, tc.fix)
			require.Equal(t, tc.want == Fail, Failed(rs))
		})
	}
}

func TestDoctorNamesTheInterpreterAndHowToChooseAnother(t *testing.T) {
	cfg := config.Default()
	cfg.Resolve(t.TempDir())
	cfg.Workload.Interpreter = fakePython(t, cpuTorch)
	r := find(t, machine(t, false, "8000000").Run(context.Background(), cfg), "interpreter")
	require.Equal(t, OK, r.Status)
	require.Contains(t, r.Detail, cfg.Workload.Interpreter)
	require.Contains(t, r.Detail, "P2PNODE_WORKLOAD_INTERPRETER")

	cfg.Workload.Interpreter = "no-such-python-here"
	r = find(t, machine(t, false, "8000000").Run(context.Background(), cfg), "interpreter")
	require.Equal(t, Fail, r.Status)
	require.Contains(t, r.Detail, `"no-such-python-here" is not in PATH`)
}

func TestDoctorPortInUseFailsAndChangesNothing(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer l.Close()
	port := l.Addr().(*net.TCPAddr).Port
	cfg := config.Default()
	store := filepath.Join(t.TempDir(), "store")
	cfg.Node.StoreDir = store
	cfg.Node.Listen = []string{"/ip4/127.0.0.1/tcp/" + itoa(port)}
	cfg.Workload.Interpreter = fakePython(t, cpuTorch)
	rs := machine(t, false, "8000000").Run(context.Background(), cfg)
	r := find(t, rs, "port")
	require.Equal(t, Fail, r.Status)
	require.Contains(t, r.Detail, "node.listen /ip4/127.0.0.1/tcp/"+itoa(port))
	require.Contains(t, r.Fix, "--listen")
	_, err = os.Stat(store)
	require.True(t, os.IsNotExist(err), "doctor created the store")
	require.Contains(t, find(t, rs, "disk").Detail, "free at")
}

func itoa(i int) string { return strconv.Itoa(i) }

// node.http's default port falls back to the next ones when taken: a warning, not a failure.
func TestDoctorDefaultHTTPTakenOnlyWarns(t *testing.T) {
	l, err := net.Listen("tcp", config.DefaultHTTP)
	if err != nil {
		t.Skipf("cannot hold %s for the test: %v", config.DefaultHTTP, err)
	}
	defer l.Close()
	cfg := config.Default()
	cfg.Resolve(t.TempDir())
	cfg.Workload.Interpreter = fakePython(t, cpuTorch)
	rs := machine(t, false, "8000000").Run(context.Background(), cfg)
	var http Result
	for _, r := range rs {
		if r.Name == "port" && strings.Contains(r.Detail, "node.http") {
			http = r
		}
	}
	require.Equal(t, Warn, http.Status, http.Detail)
	require.False(t, Failed(rs))

	// Another port set by hand has no fallback: taken, it fails.
	other, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer other.Close()
	cfg.Node.HTTP = other.Addr().String()
	require.True(t, Failed(machine(t, false, "8000000").Run(context.Background(), cfg)))
}
