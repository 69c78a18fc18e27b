package progress

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// clock is a fake clock the tests move by hand.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *clock) to(s float64)   { c.mu.Lock(); c.now = at(s); c.mu.Unlock() }

// screen is what a terminal shows for the bytes written to it: each \r\x1b[K erases the
// current line.
func screen(out string) string {
	lines := strings.Split(out, "\n")
	for i, l := range lines {
		if j := strings.LastIndex(l, clearLine); j >= 0 {
			lines[i] = l[j+len(clearLine):]
		}
	}
	return strings.Join(lines, "\n")
}

func TestTerminal(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(term *Terminal, c *clock, other func(string))
		want string
	}{
		{"work shorter than ShowAfter leaves nothing", func(term *Terminal, c *clock, _ func(string)) {
			k := term.Start("fetch", InBytes, 100, 0)
			c.to(0.5)
			k.Set(100)
			k.Finish(nil)
		}, ""},
		{"long work is drawn and leaves its summary", func(term *Terminal, c *clock, _ func(string)) {
			k := term.Start("fetch", InBytes, 4000, 0)
			c.to(2)
			k.Set(1000)
			c.to(4)
			k.Set(2000)
			c.to(8)
			k.Set(4000)
			k.Finish(nil)
		}, "fetch  3.91 KiB in 8s (500 B/s)\n"},
		{"the status line stays while it runs", func(term *Terminal, c *clock, _ func(string)) {
			k := term.Start("catching up", "heads", 40, 0)
			c.to(2)
			k.Add(10)
			c.to(4)
			k.Add(10)
		}, "catching up  20 / 40 heads  50%  5.00 heads/s  4s left"},
		{"redraws at most every Redraw", func(term *Terminal, c *clock, _ func(string)) {
			k := term.Start("fetch", InBytes, 100, 0)
			c.to(2)
			k.Set(10)
			c.to(2.1)
			k.Set(90) // within Redraw of the last draw: not drawn
		}, "fetch  10 B / 100 B  10%  5 B/s  18s left"},
		{"other output goes above the status line", func(term *Terminal, c *clock, other func(string)) {
			k := term.Start("fetch", InBytes, 100, 0)
			c.to(2)
			k.Set(50)
			other("round 1  train-loss 2.0\n")
		}, "round 1  train-loss 2.0\nfetch  50 B / 100 B  50%  25 B/s  2s left"},
		{"two tasks share the line; a failed one says where it stopped", func(term *Terminal, c *clock, _ func(string)) {
			a := term.Start("a", InBytes, 100, 0)
			b := term.Start("b", "heads", 10, 0)
			c.to(2)
			a.Set(50)
			c.to(3)
			b.Set(5)
			a.Finish(errors.New("no peer holds it"))
		}, "a  stopped at 50 B of 100 B: no peer holds it\nb  5 / 10 heads  50%  1.67 heads/s  3s left"},
		{"finish twice and set after finish do nothing", func(term *Terminal, c *clock, _ func(string)) {
			k := term.Start("fetch", InBytes, 10, 0)
			c.to(2)
			k.Set(10)
			k.Finish(nil)
			k.Finish(errors.New("again"))
			k.Set(3)
		}, "fetch  10 B in 2s (5 B/s)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			c := &clock{now: t0}
			term := newTerminal(&out, c.Now)
			w := term.Wrap(&out)
			tc.run(term, c, func(s string) { w.Write([]byte(s)) })
			if got := screen(out.String()); got != tc.want {
				t.Errorf("screen:\n%q\nwant\n%q\n(written %q)", got, tc.want, out.String())
			}
		})
	}
}

func TestLog(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(l *Log, c *clock)
		want []map[string]any
	}{
		{"short work logs nothing", func(l *Log, c *clock) {
			k := l.Start("fetch", InBytes, 100, 0)
			c.to(9)
			k.Set(100)
			k.Finish(nil)
		}, nil},
		{"a line every LogEvery, and one at the end", func(l *Log, c *clock) {
			k := l.Start("fetch", InBytes, 1000, 0)
			c.to(10)
			k.Set(200)
			c.to(15)
			k.Set(300) // 5 s after the last line: none
			c.to(20)
			k.Set(400)
			c.to(25)
			k.Set(1000)
			k.Finish(nil)
		}, []map[string]any{
			{"msg": "progress", "task": "fetch", "done": 200.0, "total": 1000.0, "percent": 20.0, "per_second": 20.0, "left_seconds": 40.0},
			{"msg": "progress", "task": "fetch", "done": 400.0, "total": 1000.0, "percent": 40.0, "per_second": 20.0, "left_seconds": 30.0},
			{"msg": "progress done", "task": "fetch", "done": 1000.0, "seconds": 25.0},
		}},
		{"counts name their unit; a stop says why", func(l *Log, c *clock) {
			k := l.Start("catching up", "heads", 0, 0)
			c.to(10)
			k.Add(30)
			k.Finish(errors.New("peer gone"))
		}, []map[string]any{
			{"msg": "progress", "task": "catching up", "done": 30.0, "unit": "heads", "per_second": 3.0},
			{"msg": "progress stopped", "task": "catching up", "done": 30.0, "err": "peer gone"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out bytes.Buffer
			c := &clock{now: t0}
			l := &Log{log: slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{ReplaceAttr: dropTime})), every: LogEvery, now: c.Now}
			tc.run(l, c)
			var got []map[string]any
			dec := json.NewDecoder(&out)
			for dec.More() {
				var m map[string]any
				if err := dec.Decode(&m); err != nil {
					t.Fatal(err)
				}
				delete(m, "level")
				got = append(got, m)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("records:\n%v\nwant\n%v", got, tc.want)
			}
			for i := range got {
				if !equalJSON(got[i], tc.want[i]) {
					t.Errorf("record %d = %v, want %v", i, got[i], tc.want[i])
				}
			}
		})
	}
}

func dropTime(_ []string, a slog.Attr) slog.Attr {
	if a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}

func equalJSON(a, b map[string]any) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func TestStartOnNilTrackerShowsNothing(t *testing.T) {
	k := Start(nil, "fetch", InBytes, 10, 0)
	k.Add(5)
	k.Set(10)
	k.Finish(nil)
}
