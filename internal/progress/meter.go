package progress

import (
	"fmt"
	"strings"
	"time"
)

// Window is how far back Meter looks for the rate: long enough to smooth a download's
// bursts, short enough to follow a link that got slower.
const Window = 10 * time.Second

type sample struct {
	at   time.Time
	done uint64
}

// Meter follows one task's count of done units against its total and works out the
// rate and the time left from the times it is told, not the clock, so that it can be
// tested.
type Meter struct {
	total   uint64
	start   time.Time
	from    uint64   // done at the start
	samples []sample // the newest last; the first one is at or before the window's start
}

// NewMeter starts a meter at now with done units already done (a resumed download:
// they do not count toward the rate).
func NewMeter(total, done uint64, now time.Time) *Meter {
	return &Meter{total: total, start: now, from: done, samples: []sample{{now, done}}}
}

// Observe records that done units are done at now.
func (m *Meter) Observe(now time.Time, done uint64) {
	last := m.samples[len(m.samples)-1]
	if now.Before(last.at) {
		now = last.at
	}
	if now.Equal(last.at) && len(m.samples) > 1 {
		m.samples[len(m.samples)-1].done = done
	} else {
		m.samples = append(m.samples, sample{now, done})
	}
	// Keep one sample at or before the window's start, as the rate's anchor.
	cut := 0
	for cut+1 < len(m.samples) && !m.samples[cut+1].at.After(now.Add(-Window)) {
		cut++
	}
	m.samples = m.samples[cut:]
}

// Total is the task's total (0: not known).
func (m *Meter) Total() uint64 { return m.total }

// Done is the count last observed.
func (m *Meter) Done() uint64 { return m.samples[len(m.samples)-1].done }

// Elapsed is the time from the start to the last observation.
func (m *Meter) Elapsed() time.Duration { return m.samples[len(m.samples)-1].at.Sub(m.start) }

// Rate is units per second over the last Window (since the start when younger); 0 until
// two observations apart in time.
func (m *Meter) Rate() float64 {
	first, last := m.samples[0], m.samples[len(m.samples)-1]
	dt := last.at.Sub(first.at).Seconds()
	if dt <= 0 || last.done <= first.done {
		return 0
	}
	return float64(last.done-first.done) / dt
}

// Left is the time left at the current rate; false when it cannot be told (no total, no
// rate yet).
func (m *Meter) Left() (time.Duration, bool) {
	done, rate := m.Done(), m.Rate()
	if m.total == 0 {
		return 0, false
	}
	if done >= m.total {
		return 0, true
	}
	if rate <= 0 {
		return 0, false
	}
	secs := float64(m.total-done) / rate
	if secs > float64(1<<62)/float64(time.Second) {
		return 0, false
	}
	return time.Duration(secs * float64(time.Second)), true
}

// Duration writes d for a person: "0s", "42s", "4m05s", "2h03m", rounded up to the
// second, or from an hour on to the minute: time left is not less than it says.
func Duration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	s := int64((d + time.Second - 1) / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", s)
	case s < 3600:
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	default:
		mins := (s + 59) / 60
		return fmt.Sprintf("%dh%02dm", mins/60, mins%60)
	}
}

// amount writes n units: bytes in binary units, other units as a count and their name.
func amount(unit string, n uint64) string {
	if unit == InBytes {
		return Bytes(n)
	}
	return fmt.Sprintf("%d %s", n, unit)
}

func rateString(unit string, r float64) string {
	if unit == InBytes {
		return Bytes(uint64(r+0.5)) + "/s"
	}
	if r >= 999.5 {
		return Count(int64(r+0.5)) + " " + unit + "/s"
	}
	if r >= 1 {
		return sigFigs(r) + " " + unit + "/s"
	}
	return fmt.Sprintf("%.2f %s/s", r, unit)
}

// Line is the task's progress in one line: done of total, percent, rate and time left,
// each part only when it is known.
func Line(name, unit string, m *Meter) string {
	var b strings.Builder
	b.WriteString(name)
	done, total := m.Done(), m.Total()
	b.WriteString("  ")
	if total > 0 {
		if unit == InBytes {
			fmt.Fprintf(&b, "%s / %s", Bytes(done), Bytes(total))
		} else {
			fmt.Fprintf(&b, "%d / %d %s", done, total, unit)
		}
		fmt.Fprintf(&b, "  %d%%", percent(done, total))
	} else {
		b.WriteString(amount(unit, done))
	}
	if r := m.Rate(); r > 0 {
		b.WriteString("  " + rateString(unit, r))
	}
	if left, ok := m.Left(); ok && done < total {
		b.WriteString("  " + Duration(left) + " left")
	}
	return b.String()
}

// Summary is the line a finished task leaves: what was done, in how long, at what
// average rate; or where it stopped and why.
func Summary(name, unit string, m *Meter, err error) string {
	done, total := m.Done(), m.Total()
	if err != nil {
		if total > 0 {
			return fmt.Sprintf("%s  stopped at %s of %s: %v", name, amount(unit, done), amount(unit, total), err)
		}
		return fmt.Sprintf("%s  stopped at %s: %v", name, amount(unit, done), err)
	}
	el, moved := m.Elapsed(), done-min(done, m.from)
	s := fmt.Sprintf("%s  %s in %s", name, amount(unit, moved), Duration(el))
	if secs := el.Seconds(); secs > 0 && moved > 0 {
		s += " (" + rateString(unit, float64(moved)/secs) + ")"
	}
	return s
}

func percent(done, total uint64) uint64 {
	if done >= total {
		return 100
	}
	return uint64(float64(done) / float64(total) * 100)
}
