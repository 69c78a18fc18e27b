package progress

import (
	"errors"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

func at(s float64) time.Time { return t0.Add(time.Duration(s * float64(time.Second))) }

type obs struct {
	at   float64 // seconds after t0
	done uint64
}

func TestMeterRateAndTimeLeft(t *testing.T) {
	for _, tc := range []struct {
		name     string
		total    uint64
		from     uint64
		obs      []obs
		rate     float64
		left     time.Duration
		leftKnow bool
	}{
		{"no observation yet", 100, 0, nil, 0, 0, false},
		{"steady", 1000, 0, []obs{{1, 100}, {2, 200}, {3, 300}}, 100, 7 * time.Second, true},
		{"resumed bytes do not count toward the rate", 1000, 600, []obs{{2, 700}}, 50, 6 * time.Second, true},
		{"rate over the last window only", 10000, 0, []obs{{1, 5000}, {12, 5100}, {22, 6100}}, 100, 39 * time.Second, true},
		{"stalled: no rate, no time left", 1000, 0, []obs{{5, 0}}, 0, 0, false},
		{"no total: rate, no time left", 0, 0, []obs{{2, 500}}, 250, 0, false},
		{"complete", 1000, 0, []obs{{4, 1000}}, 250, 0, true},
		{"a clock that steps back counts as no time", 1000, 0, []obs{{2, 100}, {1, 200}}, 100, 8 * time.Second, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewMeter(tc.total, tc.from, t0)
			for _, o := range tc.obs {
				m.Observe(at(o.at), o.done)
			}
			if got := m.Rate(); got != tc.rate {
				t.Errorf("Rate() = %v, want %v", got, tc.rate)
			}
			left, ok := m.Left()
			if ok != tc.leftKnow || left != tc.left {
				t.Errorf("Left() = %v, %v; want %v, %v", left, ok, tc.left, tc.leftKnow)
			}
		})
	}
}

func TestDuration(t *testing.T) {
	for _, tc := range []struct {
		d    time.Duration
		want string
	}{
		{0, "0s"},
		{-time.Second, "0s"},
		{300 * time.Millisecond, "1s"},
		{42 * time.Second, "42s"},
		{245 * time.Second, "4m05s"},
		{2*time.Hour + 3*time.Minute + 59*time.Second, "2h04m"},
	} {
		if got := Duration(tc.d); got != tc.want {
			t.Errorf("Duration(%v) = %q, want %q", tc.d, got, tc.want)
		}
	}
}

func TestLineAndSummary(t *testing.T) {
	meter := func(total, from uint64, o ...obs) *Meter {
		m := NewMeter(total, from, t0)
		for _, x := range o {
			m.Observe(at(x.at), x.done)
		}
		return m
	}
	for _, tc := range []struct {
		name string
		unit string
		m    *Meter
		err  error
		line string
		sum  string
	}{
		{"bytes", InBytes, meter(400<<20, 0, obs{4, 40 << 20}), nil,
			"fetch  40.0 MiB / 400 MiB  10%  10.0 MiB/s  36s left",
			"fetch  40.0 MiB in 4s (10.0 MiB/s)"},
		{"bytes, nothing moved yet", InBytes, meter(4<<30, 0), nil,
			"fetch  0 B / 4.00 GiB  0%",
			"fetch  0 B in 0s"},
		{"bytes, total unknown", InBytes, meter(0, 0, obs{2, 3 << 20}), nil,
			"fetch  3.00 MiB  1.50 MiB/s",
			"fetch  3.00 MiB in 2s (1.50 MiB/s)"},
		{"heads", "heads", meter(500, 0, obs{3, 120}), nil,
			"fetch  120 / 500 heads  24%  40.0 heads/s  10s left",
			"fetch  120 heads in 3s (40.0 heads/s)"},
		{"slow count", "files", meter(10, 0, obs{4, 1}), nil,
			"fetch  1 / 10 files  10%  0.25 files/s  36s left",
			"fetch  1 files in 4s (0.25 files/s)"},
		{"resumed, then stopped", InBytes, meter(1000, 600, obs{2, 700}), errors.New("no peer holds the artifact"),
			"fetch  700 B / 1000 B  70%  50 B/s  6s left",
			"fetch  stopped at 700 B of 1000 B: no peer holds the artifact"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Line("fetch", tc.unit, tc.m); got != tc.line {
				t.Errorf("Line = %q\n want %q", got, tc.line)
			}
			if got := Summary("fetch", tc.unit, tc.m, tc.err); got != tc.sum {
				t.Errorf("Summary = %q\n want %q", got, tc.sum)
			}
		})
	}
}
