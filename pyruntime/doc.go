// Package pyruntime runs the user's PyTorch workload for the node: it owns the Python
// worker process (spawn, the framed request/response channel on fds 3 and 4, deadlines,
// restarts, log forwarding), the checkpoint-command backend for users with their own
// training script, the scratch directory on tmpfs where parameter packs are exchanged, and
// the embedded p2ptrain Python package (python/p2ptrain), which is extracted to a cache
// directory keyed by its content hash so that the p2pnode binary is self-contained.
//
// The contract with Python is docs/worker-protocol.md; tensors travel as safetensors packs
// (docs/formats.md, package pack), never in frames. The package does not merge or
// aggregate anything: it trains, evaluates, and moves packs in and out of the model.
//
// Use:
//
//	rt, err := pyruntime.New(pyruntime.Options{Interpreter: "/usr/bin/python3",
//		Factory: "p2ptrain.workloads.digits:Digits", Logger: log})
//	info, err := rt.Start(ctx)          // spawns the worker, hello (version, capabilities)
//	err = rt.Init(ctx, seed, genesisPath)
//	res, err := rt.Train(ctx, pyruntime.TrainJob{Base: base, Shards: files, Steps: 20, Out: out})
//	metrics, err := rt.Evaluate(ctx, out)
//	defer rt.Close()
//
// Every call has a deadline (the context's or Options.CallTimeout / TrainTimeout). A worker
// that exits or hangs during a call is killed (its whole process group), the call fails with
// an error naming the method, the worker and the tail of its stderr (ErrWorkerExited,
// ErrTimeout), and a fresh worker is started in the background; after MaxRestarts failed
// restarts in a row the runtime gives up (StateFailed, ErrFailed). Errors raised in Python
// arrive as *RemoteError and match the sentinels ErrNonFinite, ErrLayoutMismatch,
// ErrWorkload, ErrBadRequest and ErrInternal with errors.Is.
package pyruntime
