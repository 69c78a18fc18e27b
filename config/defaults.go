package config

import (
	"time"

	"github.com/p2pnode/p2pnode/codecs"
)

// DefaultHTTP is node.http's default: a fixed port, so that the dashboard is found at the
// same address every time, with a fallback when it is taken (status.HTTPServer.Fallback).
const DefaultHTTP = "127.0.0.1:8970"

// Default returns the config every file is decoded over: a single node that trains the
// digits workload on its own (validator + trainer) with DiLoCo.
func Default() *Config {
	return &Config{
		Node: Node{
			StoreDir:       ".p2pnode",
			Listen:         []string{"/ip4/0.0.0.0/tcp/0", "/ip4/0.0.0.0/udp/0/quic-v1"},
			HTTP:           DefaultHTTP,
			DHT:            true,
			LogLevel:       "info",
			ChunkSize:      1 << 20,
			StreamDeadline: 10 * time.Second,
			KeepHeads:      2,
			RelayLimit:     RelayLimit{Duration: 10 * time.Minute, DataMiB: 64},
			Reachability:   ReachAuto,
		},
		Experiment: Experiment{
			Network:   "p2ptrain",
			ID:        "digits",
			Roles:     []string{RoleValidator, RoleTrainer},
			Quorum:    1,
			Rounds:    DefaultRounds,
			Seed:      1,
			EvalEvery: 1,
		},
		Dataset: Dataset{
			Root:            "data/digits",
			Manifest:        "manifest.json",
			Prepare:         true,
			MicroshardBytes: 4 << 10,
		},
		Workload: Workload{
			Interpreter:  "/usr/bin/python3",
			Factory:      "p2ptrain.workloads.digits:Digits",
			Device:       "auto",
			Precision:    PrecisionFP32,
			Threads:      1,
			Shard:        ShardDDP,
			RankTimeout:  2 * time.Minute,
			Backend:      BackendWorker,
			CallTimeout:  2 * time.Minute,
			TrainTimeout: 30 * time.Minute,
		},
		Protocol: Protocol{
			MergePolicy:        PolicyDiLoCo,
			InnerSteps:         20,
			Codec:              codecs.FP32,
			Int8Block:          256,
			SparseBlock:        4096,
			SparseTopK:         64,
			SparseWarmupRounds: 4,
			SparseWarmupFactor: 16,
			// diloco.DefaultFeedbackDecay; docs/wan.md has the measurements.
			SparseFeedbackDecay: 0.95,
			DiLoCo:              DiLoCo{OuterLR: DefaultOuterLR, Momentum: DefaultOuterMomentum, Nesterov: DefaultNesterov},
			EMA:                 EMA{NewWeight: 0.5},
		},
		Merge: Merge{
			Aggregator:   "mean",
			TrimFraction: 0.2,
			Screen:       Screen{MaxNormRatio: 10, MinCosine: new(0.0), CosineTolerance: 4, Reference: ReferenceAuto},
		},
		Lease: Lease{
			MicroshardsPerTrainer: 4,
			MinGroup:              1,
			RoundTimeout:          10 * time.Minute,
			MinDeadline:           3 * time.Second,
			FirstDeadline:         30 * time.Second,
			QuarantineRounds:      5,
		},
		Export: Export{
			EveryRounds: 0,
			InPlace:     true,
			ShardBytes:  2 << 30,
			BlockBytes:  64 << 10,
		},
	}
}
