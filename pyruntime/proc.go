package pyruntime

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	tailLines   = 20
	maxLineLen  = 64 << 10
	tailLineLen = 2048
)

// child is a Python process (worker or command) in its own process group, with its stdout
// and stderr forwarded line by line to the logger and the last stderr lines kept for error
// messages.
type child struct {
	cmd  *exec.Cmd
	pid  int
	log  *slog.Logger
	done chan struct{} // closed once the process has been reaped
	err  error         // cmd.Wait's result; read after done

	outDone chan struct{} // closed when both output streams have ended
	tailMu  sync.Mutex
	tail    []string
}

// startChild starts name args... with env, extra files as fds 3, 4, ... and stdin from
// /dev/null. The caller closes its copies of extra after startChild returns.
func startChild(name string, args []string, env []string, extra []*os.File, log *slog.Logger) (*child, error) {
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	cmd := exec.Command(name, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = outW, errW
	cmd.ExtraFiles = extra
	// Own process group: a timeout kills the worker and anything it spawned. Pdeathsig:
	// the worker does not outlive the node.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return nil, err
	}
	c := &child{cmd: cmd, pid: cmd.Process.Pid, done: make(chan struct{}), outDone: make(chan struct{})}
	c.log = log.With("worker", c.pid)
	var wg sync.WaitGroup
	wg.Add(2)
	go c.forward(&wg, outR, "stdout", slog.LevelInfo)
	go c.forward(&wg, errR, "stderr", slog.LevelWarn)
	go func() {
		wg.Wait()
		close(c.outDone)
	}()
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	return c, nil
}

func (c *child) forward(wg *sync.WaitGroup, r *os.File, stream string, level slog.Level) {
	defer wg.Done()
	defer r.Close()
	br := bufio.NewReaderSize(r, maxLineLen)
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			text := strings.TrimRight(string(line), "\r\n")
			c.log.Log(context.Background(), level, "python "+stream, "line", text)
			if stream == "stderr" {
				c.keep(text)
			}
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			return // io.EOF or a read error: the process closed its end
		}
	}
}

func (c *child) keep(line string) {
	if len(line) > tailLineLen {
		line = line[:tailLineLen] + "…"
	}
	c.tailMu.Lock()
	defer c.tailMu.Unlock()
	c.tail = append(c.tail, line)
	if len(c.tail) > tailLines {
		c.tail = c.tail[len(c.tail)-tailLines:]
	}
}

// stderrTail returns the last n stderr lines, waiting up to wait for output that is still
// in flight (after the process exited, its last lines may not have been read yet).
func (c *child) stderrTail(n int, wait time.Duration) []string {
	if wait > 0 {
		select {
		case <-c.outDone:
		case <-time.After(wait):
		}
	}
	c.tailMu.Lock()
	defer c.tailMu.Unlock()
	t := c.tail
	if len(t) > n {
		t = t[len(t)-n:]
	}
	return append([]string(nil), t...)
}

func (c *child) exited() bool {
	select {
	case <-c.done:
		return true
	default:
		return false
	}
}

// kill sends SIGKILL to the whole process group while the leader is not yet reaped (after
// that its group id could in principle be reused).
func (c *child) kill() {
	if !c.exited() {
		_ = syscall.Kill(-c.pid, syscall.SIGKILL)
	}
}

// killAndWait kills the group and waits for the leader to be reaped.
func (c *child) killAndWait(d time.Duration) {
	c.kill()
	select {
	case <-c.done:
	case <-time.After(d):
	}
}

// exitString describes how the process ended ("exit status 3", "signal: killed").
func (c *child) exitString() string {
	if !c.exited() {
		return "still running"
	}
	if c.err == nil {
		return "exit status 0"
	}
	var ee *exec.ExitError
	if errors.As(c.err, &ee) {
		return ee.ProcessState.String()
	}
	return c.err.Error()
}

func formatTail(lines []string) string {
	if len(lines) == 0 {
		return "stderr was empty"
	}
	return "last stderr lines:\n\t" + strings.Join(lines, "\n\t")
}

func isBrokenPipe(err error) bool { return errors.Is(err, syscall.EPIPE) }
