package doctor

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/libp2p/go-libp2p/core/protocol"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptls "github.com/libp2p/go-libp2p/p2p/security/tls"
	ma "github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"
	"github.com/multiformats/go-multistream"

	"github.com/p2pnode/p2pnode/config"
)

// Status is a check's outcome.
type Status int

// Outcomes, from good to bad.
const (
	OK Status = iota
	Warn
	Fail
)

func (s Status) String() string { return [...]string{"ok", "warn", "FAIL"}[s] }

// Result is one check.
type Result struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	Detail string `json:"detail"`
	// Fix says what to do about a warning or a failure.
	Fix string `json:"fix,omitempty"`
}

// Thresholds below which a check warns.
const (
	MinFreeDisk = 2 << 30
	MinMemory   = 2 << 30
	MinShm      = 512 << 20
)

// Machine is what the checks read from the machine; tests replace parts of it.
type Machine struct {
	// DevDir holds the device nodes (/dev).
	DevDir string
	// MemInfo is /proc/meminfo.
	MemInfo string
	// LookPath finds a program in PATH.
	LookPath func(string) (string, error)
	// ProbeTimeout bounds the interpreter's probe (importing torch takes seconds).
	ProbeTimeout time.Duration
	// DialBack asks a peer whether it can dial this machine (nil: over the network).
	DialBack DialBack
}

// System is this machine.
func System() Machine {
	return Machine{DevDir: "/dev", MemInfo: "/proc/meminfo", LookPath: exec.LookPath, ProbeTimeout: 2 * time.Minute}
}

// Run checks the machine for cfg (a loaded config: its paths resolved).
func (m Machine) Run(ctx context.Context, cfg *config.Config) []Result {
	var out []Result
	py, probe := m.interpreter(ctx, cfg)
	out = append(out, py...)
	out = append(out, m.device(cfg, probe))
	out = append(out, disk(cfg), m.memory(), m.shm())
	out = append(out, ports(cfg)...)
	out = append(out, bootstrap(ctx, cfg)...)
	out = append(out, m.reachability(ctx, cfg))
	return out
}

// Failed reports whether any result failed.
func Failed(rs []Result) bool {
	for _, r := range rs {
		if r.Status == Fail {
			return true
		}
	}
	return false
}

// probe is what the interpreter says about itself.
type probe struct {
	Python    string   `json:"python"`
	Torch     string   `json:"torch"`
	TorchErr  string   `json:"torch_error"`
	NumPy     string   `json:"numpy"`
	NumPyErr  string   `json:"numpy_error"`
	CUDA      bool     `json:"cuda"`
	CUDABuild string   `json:"cuda_build"`
	GPUs      []string `json:"gpus"`
	MPS       bool     `json:"mps"`
}

const probeScript = `
import json, sys
out = {"python": sys.version.split()[0] + " at " + sys.executable}
try:
    import numpy
    out["numpy"] = numpy.__version__
except Exception as e:
    out["numpy_error"] = type(e).__name__ + ": " + str(e)
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda_build"] = torch.version.cuda or ""
    out["cuda"] = bool(torch.cuda.is_available())
    out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if out["cuda"] else []
    mps = getattr(torch.backends, "mps", None)
    out["mps"] = bool(mps and mps.is_available())
except Exception as e:
    out["torch_error"] = type(e).__name__ + ": " + str(e)
print(json.dumps(out))
`

const chooseInterpreter = "set workload.interpreter in the config (a path is relative to the config file), " +
	"or P2PNODE_WORKLOAD_INTERPRETER=/path/to/python"

func (m Machine) interpreter(ctx context.Context, cfg *config.Config) ([]Result, *probe) {
	name := cfg.Workload.Interpreter
	if name == "" {
		name = "python3"
	}
	path := name
	if !strings.ContainsRune(name, filepath.Separator) {
		p, err := m.LookPath(name)
		if err != nil {
			return []Result{{Name: "interpreter", Status: Fail, Detail: fmt.Sprintf("workload.interpreter %q is not in PATH", name),
				Fix: "install Python 3 with torch (Debian: apt-get install python3-torch python3-numpy libopenblas0-pthread), or " + chooseInterpreter}}, nil
		}
		path = p
	}
	ctx, cancel := context.WithTimeout(ctx, m.ProbeTimeout)
	defer cancel()
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, path, "-c", probeScript)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var p probe
	if err == nil {
		err = json.Unmarshal(bytes.TrimSpace(lastLine(stdout.Bytes())), &p)
	}
	if err != nil {
		return []Result{{Name: "interpreter", Status: Fail, Detail: fmt.Sprintf("workload.interpreter %s does not run as Python 3: %v %s", path, err, strings.TrimSpace(stderr.String())),
			Fix: chooseInterpreter}}, nil
	}
	rs := []Result{{Name: "interpreter", Status: OK, Detail: fmt.Sprintf("Python %s (workload.interpreter %s; to use another, %s)", p.Python, name, chooseInterpreter)}}
	switch {
	case p.TorchErr != "":
		rs = append(rs, Result{Name: "torch", Status: Fail, Detail: fmt.Sprintf("%s cannot import torch: %s", path, p.TorchErr),
			Fix: "install torch for this interpreter (Debian: apt-get install python3-torch libopenblas0-pthread), or " + chooseInterpreter})
	case p.NumPyErr != "":
		rs = append(rs, Result{Name: "torch", Status: Fail, Detail: fmt.Sprintf("torch %s, but %s cannot import numpy: %s", p.Torch, path, p.NumPyErr),
			Fix: "install numpy for this interpreter (Debian: apt-get install python3-numpy), or " + chooseInterpreter})
	default:
		build := "CPU-only build"
		if p.CUDABuild != "" {
			build = "CUDA " + p.CUDABuild + " build"
		}
		rs = append(rs, Result{Name: "torch", Status: OK, Detail: fmt.Sprintf("torch %s (%s), numpy %s", p.Torch, build, p.NumPy)})
	}
	return rs, &p
}

func lastLine(b []byte) []byte {
	b = bytes.TrimRight(b, "\n")
	if i := bytes.LastIndexByte(b, '\n'); i >= 0 {
		return b[i+1:]
	}
	return b
}

// nvidia reports how the machine shows an NVIDIA GPU ("" when it does not).
func (m Machine) nvidia() string {
	if ms, _ := filepath.Glob(filepath.Join(m.DevDir, "nvidia[0-9]*")); len(ms) > 0 {
		return ms[0]
	}
	if p := filepath.Join(m.DevDir, "nvidiactl"); exists(p) {
		return p
	}
	if p, err := m.LookPath("nvidia-smi"); err == nil {
		return p
	}
	return ""
}

func exists(p string) bool { _, err := os.Stat(p); return err == nil }

func (m Machine) device(cfg *config.Config, p *probe) Result {
	want := cfg.Workload.Device
	if len(cfg.Workload.Devices) > 0 {
		want = strings.Join(cfg.Workload.Devices, ",")
	}
	if p == nil || p.Torch == "" {
		return Result{Name: "device", Status: Warn, Detail: fmt.Sprintf("workload.device %s: not checked without torch", want)}
	}
	gpu := m.nvidia()
	cudaWanted := strings.HasPrefix(want, "cuda") || len(cfg.Workload.Devices) > 0
	switch {
	case p.CUDA:
		return Result{Name: "device", Status: OK, Detail: fmt.Sprintf("workload.device %s; CUDA GPUs: %s", want, strings.Join(p.GPUs, ", "))}
	case cudaWanted:
		detail := fmt.Sprintf("workload.device %s, but torch %s cannot use CUDA", want, p.Torch)
		if gpu != "" {
			detail += fmt.Sprintf(" (this machine has an NVIDIA GPU: %s)", gpu)
		}
		return Result{Name: "device", Status: Fail, Detail: detail, Fix: cudaFix}
	case gpu != "":
		return Result{Name: "device", Status: Warn, Detail: fmt.Sprintf("this machine has an NVIDIA GPU (%s), but torch %s (%s) cannot use it: workload.device %s trains on the CPU",
			gpu, p.Torch, orNone(p.CUDABuild), want), Fix: cudaFix}
	case p.MPS:
		return Result{Name: "device", Status: OK, Detail: fmt.Sprintf("workload.device %s: Apple MPS", want)}
	}
	return Result{Name: "device", Status: OK, Detail: fmt.Sprintf("workload.device %s: the CPU (no GPU on this machine)", want)}
}

const cudaFix = "install a CUDA build of torch (e.g. in a venv: pip install torch --index-url https://download.pytorch.org/whl/cu124, " +
	"or the image built with BASE_IMAGE=, docs/gpu.md) and point workload.interpreter at that Python; check the driver with nvidia-smi"

func orNone(s string) string {
	if s == "" {
		return "CPU-only build"
	}
	return "CUDA " + s + " build"
}

// existingDir is the nearest directory of path that exists (the store may not yet).
func existingDir(path string) string {
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			return p
		}
		if p == filepath.Dir(p) {
			return p
		}
	}
}

func freeBytes(path string) (uint64, error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0, err
	}
	return st.Bavail * uint64(st.Bsize), nil
}

func gib(b uint64) string { return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30)) }

func disk(cfg *config.Config) Result {
	dir := existingDir(cfg.Node.StoreDir)
	free, err := freeBytes(dir)
	if err != nil {
		return Result{Name: "disk", Status: Warn, Detail: fmt.Sprintf("free space at %s: %v", dir, err)}
	}
	detail := fmt.Sprintf("%s free at %s (node.store_dir %s; the store keeps node.keep_heads=%d heads' parameters, the dataset goes to %s)",
		gib(free), dir, cfg.Node.StoreDir, cfg.Node.KeepHeads, cfg.Dataset.Root)
	if free < MinFreeDisk {
		return Result{Name: "disk", Status: Warn, Detail: detail, Fix: fmt.Sprintf("free space or point node.store_dir (--store) at a disk with more than %s free", gib(MinFreeDisk))}
	}
	return Result{Name: "disk", Status: OK, Detail: detail}
}

func (m Machine) memory() Result {
	f, err := os.Open(m.MemInfo)
	if err != nil {
		return Result{Name: "memory", Status: Warn, Detail: fmt.Sprintf("read %s: %v", m.MemInfo, err)}
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) >= 2 && fs[0] == "MemAvailable:" {
			kb, err := strconv.ParseUint(fs[1], 10, 64)
			if err != nil {
				break
			}
			avail := kb << 10
			if avail < MinMemory {
				return Result{Name: "memory", Status: Warn, Detail: gib(avail) + " available",
					Fix: "stop other programs, or train a smaller model: the worker holds the model, its gradients and the inner optimizer's state"}
			}
			return Result{Name: "memory", Status: OK, Detail: gib(avail) + " available"}
		}
	}
	return Result{Name: "memory", Status: Warn, Detail: "no MemAvailable in " + m.MemInfo}
}

func (m Machine) shm() Result {
	dir := filepath.Join(m.DevDir, "shm")
	free, err := freeBytes(dir)
	if errors.Is(err, fs.ErrNotExist) || err != nil {
		return Result{Name: "/dev/shm", Status: Warn, Detail: fmt.Sprintf("%s is not there: parameter packs go through <store_dir>/scratch on disk (slower)", dir)}
	}
	if free < MinShm {
		return Result{Name: "/dev/shm", Status: Warn, Detail: fmt.Sprintf("%s free at %s: packs that do not fit go through <store_dir>/scratch on disk (slower)", gib(free), dir),
			Fix: "in Docker, run with --shm-size 2g (about five times the model's fp32 bytes)"}
	}
	return Result{Name: "/dev/shm", Status: OK, Detail: fmt.Sprintf("%s free at %s", gib(free), dir)}
}

// ports binds each fixed port of node.listen and node.http for an instant.
func ports(cfg *config.Config) []Result {
	var out []Result
	for _, l := range cfg.Node.Listen {
		a, err := ma.NewMultiaddr(l)
		if err != nil {
			out = append(out, Result{Name: "port", Status: Fail, Detail: fmt.Sprintf("node.listen %q: %v", l, err), Fix: "fix node.listen (--listen)"})
			continue
		}
		network, hostport, err := manet.DialArgs(a)
		if err != nil {
			continue // not TCP or UDP: nothing to bind
		}
		if strings.HasSuffix(hostport, ":0") {
			continue
		}
		if err := tryBind(network, hostport); err != nil {
			out = append(out, Result{Name: "port", Status: Fail, Detail: fmt.Sprintf("node.listen %s: %v", l, err),
				Fix: "stop what uses the port (ss -ltnup), or choose another in node.listen (--listen)"})
			continue
		}
		out = append(out, Result{Name: "port", Status: OK, Detail: fmt.Sprintf("node.listen %s is free", l)})
	}
	if h := cfg.Node.HTTP; h != "" && h != "off" && !strings.HasSuffix(h, ":0") {
		err := tryBind("tcp", h)
		switch {
		case err != nil && h == config.DefaultHTTP:
			// The default port falls back to the next free ones (another node on this machine).
			out = append(out, Result{Name: "port", Status: Warn, Detail: fmt.Sprintf("node.http %s is taken (%v): the node will serve its dashboard on a port after it, and print where", h, err)})
		case err != nil:
			out = append(out, Result{Name: "port", Status: Fail, Detail: fmt.Sprintf("node.http %s: %v", h, err),
				Fix: "stop what uses the port, or choose another node.http (--http)"})
		default:
			out = append(out, Result{Name: "port", Status: OK, Detail: fmt.Sprintf("node.http %s is free", h)})
		}
	}
	if len(out) == 0 {
		out = append(out, Result{Name: "port", Status: OK, Detail: "node.listen and node.http take free ports at start"})
	}
	return out
}

func tryBind(network, hostport string) error {
	if strings.HasPrefix(network, "udp") {
		c, err := net.ListenPacket(network, hostport)
		if err != nil {
			return err
		}
		return c.Close()
	}
	l, err := net.Listen(network, hostport)
	if err != nil {
		return err
	}
	return l.Close()
}

// bootstrap dials each bootstrap peer's TCP addresses: can this machine reach the swarm,
// and is it a libp2p node that answers there?
func bootstrap(ctx context.Context, cfg *config.Config) []Result {
	var out []Result
	for _, b := range cfg.Node.Bootstrap {
		a, err := ma.NewMultiaddr(b)
		if err != nil {
			out = append(out, Result{Name: "reach", Status: Fail, Detail: fmt.Sprintf("node.bootstrap %q: %v", b, err)})
			continue
		}
		network, hostport, err := manet.DialArgs(a)
		if err != nil || !strings.HasPrefix(network, "tcp") {
			continue
		}
		d := net.Dialer{Timeout: 5 * time.Second}
		c, err := d.DialContext(ctx, network, hostport)
		if err != nil {
			out = append(out, Result{Name: "reach", Status: Warn, Detail: fmt.Sprintf("bootstrap %s: %v", hostport, err),
				Fix: "check this machine's outbound connections (firewall, proxy) and that the address is the one 'p2pnode invite' printed"})
			continue
		}
		r := greet(c, hostport, cfg.Node.PSK != "")
		c.Close()
		out = append(out, r)
	}
	return out
}

// greetTimeout bounds the wait for a bootstrap peer's first libp2p message.
const greetTimeout = 5 * time.Second

// greet tells a libp2p node from anything else that accepts a TCP connection at its
// address (a proxy or firewall that intercepts it, another service on the port): it opens
// the connection as a libp2p dialer does, with multistream-select proposing the security
// protocols libp2p offers, and needs a libp2p answer. Under node.psk the connection is
// encrypted before that exchange, so only the TCP connection is checked.
func greet(c net.Conn, hostport string, psk bool) Result {
	if psk {
		return Result{Name: "reach", Status: OK, Detail: fmt.Sprintf("bootstrap %s answers (TCP only: under node.psk the libp2p greeting is encrypted)", hostport)}
	}
	if err := c.SetDeadline(time.Now().Add(greetTimeout)); err != nil {
		return Result{Name: "reach", Status: Warn, Detail: fmt.Sprintf("bootstrap %s: %v", hostport, err)}
	}
	proto, err := multistream.SelectOneOf([]protocol.ID{noise.ID, libp2ptls.ID}, c)
	if err != nil {
		return Result{Name: "reach", Status: Warn,
			Detail: fmt.Sprintf("bootstrap %s accepts TCP connections but does not answer as a libp2p node (%s)", hostport, strings.Join(strings.Fields(err.Error()), " ")),
			Fix:    "check that the address is the one 'p2pnode invite' printed and that the node runs there; a proxy or firewall between this machine and it may be intercepting the connection"}
	}
	return Result{Name: "reach", Status: OK, Detail: fmt.Sprintf("bootstrap %s answers as a libp2p node (%s)", hostport, proto)}
}
