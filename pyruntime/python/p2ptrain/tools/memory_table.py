"""Memory and speed of the lm workload under each memory option, as a markdown table.

    python3 -m p2ptrain.tools.memory_table --preset small --device cpu --steps 5 \\
        --option fp32 --option fp32+ac --option bf16 --option bf16+ac

An option is ``+``-joined words: a precision (``fp32``, ``bf16``, ``fp16``), ``ac``
(``workload.activation_checkpointing``), and ``ddpN`` / ``fsdpN`` (N ranks over the
``--devices`` given, ``workload.shard``). Each option runs in a fresh process (a fresh
peak): the worker's own code (``Session``, or ``Ranks`` for ranks) builds the model, trains
one warm-up step, then ``--steps`` steps, on the lm's own data. Columns: seconds per step
(the timed steps), the worker process's CPU seconds per step (one-process rows: what tells
options apart on a machine that others load too), samples per second (every rank's), each process's peak RSS (the worker, or each rank), and on CUDA
``torch.cuda.max_memory_allocated`` per device. An option that does not fit says why
(out of memory, or refused) in its row.

Peak RSS depends on glibc's malloc as much as on what is alive: ``--malloc node`` (the
default) runs the options with the settings the node gives its worker (no mmap'd chunks,
no trimming: pyruntime's mallocEnv), which keep the heap's high-water mark; ``--malloc
live`` hands every allocation of 1 MiB or more back when it is freed
(``MALLOC_MMAP_THRESHOLD_``), so the peak is close to the peak of live memory;
``--malloc glibc`` leaves glibc's defaults.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

PRECISIONS = ("fp32", "bf16", "fp16")


def parse_option(opt):
    out = {"precision": "fp32", "ac": False, "shard": "ddp", "ranks": 0}
    for word in opt.split("+"):
        if word in PRECISIONS:
            out["precision"] = word
        elif word == "ac":
            out["ac"] = True
        elif word.startswith(("ddp", "fsdp")) and word.lstrip("dpfs").isdigit():
            out["shard"] = "fsdp" if word.startswith("fsdp") else "ddp"
            out["ranks"] = int(word.lstrip("dpfs"))
        else:
            raise SystemExit(f"--option {opt!r}: unknown word {word!r} (fp32, bf16, fp16, ac, ddpN, fsdpN)")
    return out


def run_one(args):
    """The child: one option, a JSON line on stdout."""
    import torch

    from p2ptrain import memory
    from p2ptrain.session import Session

    o = parse_option(args.one)
    cfg = dict(json.loads(args.config), preset=args.preset)
    factory = "p2ptrain.workloads.lm:LM"
    shards = sorted(os.path.join(args.data, f) for f in os.listdir(args.data) if f.endswith(".txt"))[: args.shards]
    devices = [d for d in args.devices.split(",") if d]
    common = dict(threads=args.threads, seed=1, precision=o["precision"], activation_checkpointing=o["ac"])
    out = {"option": args.one}
    try:
        if o["ranks"] > 1:
            from p2ptrain.ranks import Ranks

            on = (devices * o["ranks"])[: o["ranks"]] if devices[0] == "cpu" else devices[: o["ranks"]]
            s = Ranks(on, factory, cfg, shard=o["shard"], **common)
        else:
            s = Session(factory, cfg, device=devices[0], **common)
        job = dict(base=None, shards=shards, opt_in=None, opt_out=None, shift=None, out=os.path.join(args.scratch, "out"))
        s.train(steps=1, seed=1, **job)
        cpu0 = time.process_time()
        r = s.train(steps=args.steps, seed=2, **job)
        if o["ranks"] <= 1:
            # CPU time tells options apart on a machine others load too; wall time does not.
            out["cpu_seconds_per_step"] = (time.process_time() - cpu0) / args.steps
        out["seconds_per_step"] = r["seconds"] / args.steps
        out["samples_per_second"] = r["samples"] / r["seconds"] if r["seconds"] > 0 else 0.0
        if o["ranks"] > 1:
            out["ranks"] = r["ranks"]
            s.close()
        else:
            rank = {"rank": 0, "device": devices[0], "peak_rss_bytes": memory.peak_rss_bytes()}
            if devices[0].startswith("cuda"):
                rank["max_memory_allocated_bytes"] = int(torch.cuda.max_memory_allocated(torch.device(devices[0])))
            out["ranks"] = [rank]
    except Exception as e:  # out of memory, refused: the row says so
        out["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    print(json.dumps(out), flush=True)


MALLOC = {
    "node": {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "68719476736"},
    "live": {"MALLOC_MMAP_THRESHOLD_": str(1 << 20)},
    "glibc": {},
}


def malloc_env(kind):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    env.update(MALLOC[kind])
    return env


def mib(n):
    return f"{n / (1 << 20):,.0f}"


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m p2ptrain.tools.memory_table", description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="small")
    ap.add_argument("--config", default="{}", help="JSON of lm config keys over the preset's")
    ap.add_argument("--devices", default="cpu", help="comma-separated devices: cpu, or cuda:0,cuda:1,...")
    ap.add_argument("--option", action="append", default=[])
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--shards", type=int, default=4, help="shard files to train on")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--malloc", choices=("node", "live", "glibc"), default="node", help="glibc malloc settings of the runs")
    ap.add_argument("--data", default="", help="the lm's prepared dataset (prepared in a temporary directory when empty)")
    ap.add_argument("--one", default="", help=argparse.SUPPRESS)
    ap.add_argument("--scratch", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.one:
        return run_one(args)
    from p2ptrain.workloads.lm import LM

    with tempfile.TemporaryDirectory(prefix="p2ptrain-memtable-") as tmp:
        data = args.data or os.path.join(tmp, "data")
        if not args.data:
            os.makedirs(data)
            LM.prepare_dataset(dict(json.loads(args.config), preset=args.preset), data)
        rows = []
        for opt in args.option or ["fp32"]:
            parse_option(opt)
            cmd = [sys.executable, "-m", "p2ptrain.tools.memory_table", "--one", opt, "--scratch", tmp, "--data", data]
            for k in ("preset", "config", "devices", "steps", "shards", "threads"):
                cmd += [f"--{k}", str(getattr(args, k))]
            p = subprocess.run(cmd, capture_output=True, text=True, env=malloc_env(args.malloc))
            lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
            row = json.loads(lines[-1]) if lines else {"option": opt, "error": f"exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}"}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print(f"| {args.preset}: option | s/step | CPU s/step | samples/s | peak RSS per process (MiB, malloc {args.malloc}) | max CUDA memory allocated per device (MiB) |")
    print("| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        if "error" in r:
            print(f"| {r['option']} | — | — | — | — | {r['error']} |")
            continue
        rss = ", ".join(mib(x["peak_rss_bytes"]) for x in r["ranks"])
        cuda = ", ".join(f"{x['device']} {mib(x['max_memory_allocated_bytes'])}" for x in r["ranks"] if "max_memory_allocated_bytes" in x) or "—"
        cpu = f"{r['cpu_seconds_per_step']:.3f}" if "cpu_seconds_per_step" in r else "—"
        print(f"| {r['option']} | {r['seconds_per_step']:.3f} | {cpu} | {r['samples_per_second']:.1f} | {rss} | {cuda} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
