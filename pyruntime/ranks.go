package pyruntime

import (
	"errors"
	"log/slog"
	"slices"
)

// RankDevice is one rank of a worker that runs several (Options.Devices, Options.Ranks):
// its device, and after a window the memory it peaked at.
type RankDevice struct {
	Rank         int    `json:"rank"`
	Device       string `json:"device"`
	DeviceName   string `json:"device_name,omitempty"`
	DeviceMemory int64  `json:"device_memory_bytes,omitempty"`
	PID          int    `json:"pid,omitempty"`
	// MaxMemoryAllocated is torch.cuda.max_memory_allocated over the last window (GPUs),
	// PeakRSS the rank process's peak resident memory.
	MaxMemoryAllocated int64 `json:"max_memory_allocated_bytes,omitempty"`
	PeakRSS            int64 `json:"peak_rss_bytes,omitempty"`
	// Idle: the last window's lease had fewer batches than the worker has ranks, and this
	// rank trained none of them.
	Idle bool `json:"idle,omitempty"`
}

// ranked reports whether the options ask the worker for ranks or a memory option: what
// only a worker that knows about them understands.
func (o Options) ranked() bool { return len(o.rankCapabilities()) > 0 }

// rankParams are hello's parameters for ranks and memory options; none when unset, so that
// a worker from before them starts as it did.
func (o Options) rankParams(params map[string]any) {
	if !o.ranked() {
		return
	}
	var devices any
	switch {
	case len(o.Devices) == 1 && o.Devices[0] == DevicesAll:
		devices = DevicesAll
	case len(o.Devices) > 0:
		devices = o.Devices
	}
	params["devices"] = devices
	params["ranks"] = o.Ranks
	params["shard"] = o.Shard
	params["activation_checkpointing"] = o.ActivationCheckpointing
	params["rank_timeout"] = o.RankTimeout.Seconds()
}

// rankCapabilities are the capabilities the options need from the worker.
func (o Options) rankCapabilities() []string {
	var need []string
	if len(o.Devices) > 0 || o.Ranks > 1 || (o.Shard != "" && o.Shard != "ddp") {
		need = append(need, "ranks")
	}
	if o.ActivationCheckpointing {
		need = append(need, "activation_checkpointing")
	}
	return need
}

// rankBook is what Status shows of the ranks: their devices as hello reported them, the
// memory of the last window, and how often they were restarted. It warns once when a lease
// leaves ranks idle. Its owner guards it.
type rankBook struct {
	devices    []RankDevice
	restarts   int
	warnedIdle bool
}

func (b *rankBook) started(info Info) { b.devices = slices.Clone(info.Devices) }

// trained takes a window's per-rank report (pids change when ranks were restarted).
func (b *rankBook) trained(res TrainResult, log *slog.Logger) {
	if len(res.Ranks) == len(b.devices) {
		for i, r := range res.Ranks {
			d := &b.devices[i]
			d.PID, d.MaxMemoryAllocated, d.PeakRSS, d.Idle = r.PID, r.MaxMemoryAllocated, r.PeakRSS, r.Idle
		}
	}
	if res.IdleRanks > 0 && !b.warnedIdle {
		b.warnedIdle = true
		log.Warn("a lease held fewer batches than the worker has ranks: the extra ranks stayed idle for that window (warned once)",
			"idle_ranks", res.IdleRanks, "ranks", len(res.Ranks))
	}
}

func (b *rankBook) failed(err error) {
	if errors.Is(err, ErrRankFailed) {
		b.restarts++
	}
}

func (b *rankBook) fill(s *Status) {
	s.Ranks, s.RankRestarts = len(b.devices), b.restarts
	s.Devices = slices.Clone(b.devices)
}

func rankDeviceNames(ds []RankDevice) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = d.Device
	}
	return out
}
