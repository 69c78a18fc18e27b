"""Ranks inside one worker: one process per device, started with ``torch.multiprocessing``.

The worker process does no training of its own here: it hosts the ``torch.distributed``
store the ranks meet at, hands every protocol call to all ranks (``rank.RankSession``), and
merges their answers into one (one pack, one optimizer state, the samples of every rank),
so that the node sees a worker like any other. Because it never enters a collective itself,
it stays free to watch the ranks:

- a rank that exits (killed, out of memory, a NCCL abort) fails the call at once;
- a rank that stops answering while the others have answered or failed (hung, or stuck in a
  collective) fails it after a short grace;
- during ``train`` and ``probe``, no rank finishing a step for ``rank_timeout`` (the
  process group's collective timeout too) fails it.

Then every rank is killed and a fresh set is started (its first call waits for it), and the
call fails with ``RankFailed`` naming the rank: the node gives the lease back and trains the
next one. Nothing is lost: ``train`` reads its base and optimizer state from files and writes
its outputs only at its end. What only ``load`` put into the ranks' memory is lost, and
``export`` says so.
"""

import datetime
import os
import signal
import sys
import time
from multiprocessing.connection import wait

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from . import rank as rank_mod
from .errors import BadRequest, P2PTrainError, RankFailed


class RemoteFailure(P2PTrainError):
    """An error a rank reported, with its protocol type."""

    def __init__(self, body, prefix=""):
        super().__init__(prefix + body.get("message", ""))
        self.type = body.get("type", "Internal")
        self.remote_traceback = body.get("traceback", "")


class Ranks:
    def __init__(self, devices, factory, config=None, include=(), exclude=(), threads=0, seed=0, precision="fp32",
                 shard="ddp", activation_checkpointing=False, timeout=120.0):
        self.devices = [torch.device(d) for d in devices]
        self.world = len(self.devices)
        self.timeout = float(timeout)
        # How long the other ranks get to answer once one has failed: ranks that fail alike
        # (a loss that is not finite, a missing file) all answer within this.
        self.grace = max(2.0, min(10.0, self.timeout))
        if not threads and self.devices[0].type == "cpu":
            threads = max(1, (os.cpu_count() or 1) // self.world)
        self.options = {
            "factory": factory, "config": dict(config or {}), "include": list(include), "exclude": list(exclude),
            "threads": int(threads or 0), "seed": int(seed), "precision": precision or "fp32", "shard": shard or "ddp",
            "activation_checkpointing": bool(activation_checkpointing), "timeout": self.timeout,
        }
        self.ctx = mp.get_context("spawn")
        self.store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=self.timeout), wait_for_workers=False)
        self.generation = 0
        self.procs = []
        self.restarts = 0
        self.loaded = self.lost_load = False
        self.infos = None
        self._start()
        try:
            self.infos = self._ready(first=True)
        except BaseException:
            self._kill()
            raise

    # ---- the rank processes --------------------------------------------------------------

    def _start(self):
        self.generation += 1
        self.procs = []
        for r, dev in enumerate(self.devices):
            mine, theirs = self.ctx.Pipe()
            p = self.ctx.Process(target=rank_mod.main, name=f"p2ptrain-rank{r}", daemon=True,
                                 args=(r, self.world, str(dev), self.store.port, self.generation, self.options, theirs))
            p.start()
            theirs.close()
            self.procs.append((p, mine))
        self.infos = None

    def _kill(self):
        for p, conn in self.procs:
            if p.is_alive():
                try:
                    os.kill(p.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p, conn in self.procs:
            p.join(10)
            conn.close()
        self.procs = []

    def _restart(self, why):
        """Kill every rank, start a fresh set, and fail the call with why."""
        self._kill()
        self.restarts += 1
        if self.loaded:
            self.lost_load = True
        self._start()
        raise RankFailed(f"{why}; all {self.world} ranks were killed and restarted")

    def _ready(self, first=False):
        """Wait for every rank of the current set to be up (its session built)."""
        return self._gather(None, watch=False, first=first, startup=True)

    def _ensure(self):
        """Make sure a full set of ranks is up before a call: one that died between calls
        (nothing of a window was lost) is replaced here without failing the call."""
        dead = [r for r, (p, _) in enumerate(self.procs) if not p.is_alive()]
        if dead and self.infos is not None:
            print(f"p2ptrain: {', '.join(self._name(r) for r in dead)} exited between calls; restarting the ranks",
                  file=sys.stderr, flush=True)
            self._kill()
            self.restarts += 1
            if self.loaded:
                self.lost_load = True
            self._start()
        if self.infos is None:
            self.infos = self._ready()

    def _name(self, r):
        return f"rank {r} ({self.devices[r]}, pid {self.procs[r][0].pid})"

    def _gather(self, method, watch, first=False, startup=False):
        """Collect one answer from every rank; see the module doc for what fails a call."""
        what = "start-up" if startup else method
        n = self.world
        answers, errors = [None] * n, {}
        conns = {conn: r for r, (_, conn) in enumerate(self.procs)}
        sentinels = {p.sentinel: r for r, (p, _) in enumerate(self.procs)}
        steps = [0] * n
        last_step = time.monotonic()
        failed_at = None
        # A fresh set may take a while to import torch and build the model. In a window, the
        # ranks waiting on a hung one fail their collective after rank_timeout, and the
        # grace after that names the hung rank: this limit is for a hang nothing reports.
        limit = self.timeout + (60.0 if startup else 2 * self.grace)
        while True:
            waiting = [c for c, r in conns.items() if answers[r] is None and r not in errors]
            if not waiting:
                break
            now = time.monotonic()
            deadlines = [last_step + limit] if (watch or startup) else []
            if failed_at is not None:
                deadlines.append(failed_at + self.grace)
            timeout = max(0.0, min(deadlines) - now) if deadlines else None
            for obj in wait(waiting + list(sentinels), timeout):
                if obj in sentinels:
                    self._died(sentinels[obj], what, first)
                r = conns[obj]
                try:
                    msg = obj.recv()
                except (EOFError, OSError):
                    self._died(r, what, first)
                if msg[0] == "progress":
                    steps[r] = msg[1]
                    last_step = time.monotonic()
                elif msg[0] in ("ok", "ready"):
                    answers[r] = msg[1]
                else:
                    errors[r] = msg[1]
                    if failed_at is None:
                        failed_at = time.monotonic()
            now = time.monotonic()
            silent = [r for r in range(n) if answers[r] is None and r not in errors]
            if errors and not silent:
                break
            if failed_at is not None and now - failed_at >= self.grace:
                r0 = min(errors)
                names = ", ".join(self._name(r) for r in silent)
                detail = f"{self._name(r0)}: {errors[r0]['type']}: {errors[r0]['message']}"
                if first:
                    failure = RemoteFailure(errors[r0], prefix=f"{self._name(r0)}: ")
                    self._kill()
                    raise failure
                self._restart(f"{names} gave no answer to {what} within {self.grace:.0f}s after {detail}")
            if (watch or startup) and now - last_step >= limit:
                if startup:
                    why = f"{', '.join(self._name(r) for r in silent)} did not start within {limit:.0f}s (workload.rank_timeout + 60s)"
                    if first:
                        self._kill()
                        raise RankFailed(why)
                    self._restart(why)
                at = ", ".join(f"rank {r} at step {s}" for r, s in enumerate(steps))
                self._restart(f"no rank finished a step of {what} for {limit:.0f}s (workload.rank_timeout + {2 * self.grace:.0f}s; {at})")
        if errors:
            # Every rank answered, and some failed alike: the ranks are in step, no restart.
            r0 = min(errors)
            failure = RemoteFailure(errors[r0], prefix=f"{self._name(r0)}: ")
            if first:
                self._kill()
            raise failure
        return answers

    def _died(self, r, what, first):
        p = self.procs[r][0]
        p.join(1)
        code = p.exitcode
        how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit status {code}"
        why = f"{self._name(r)} exited ({how}) during {what}"
        if first:
            self._kill()
            raise RankFailed(why)
        self._restart(why)

    def _call(self, method, params, watch=False):
        self._ensure()
        for p, conn in self.procs:
            try:
                conn.send(("call", method, params))
            except (BrokenPipeError, OSError):
                pass  # that rank is gone: _gather sees its sentinel
        return self._gather(method, watch)

    def close(self):
        for p, conn in self.procs:
            try:
                conn.send(("exit",))
            except (BrokenPipeError, OSError):
                pass
        deadline = time.monotonic() + 5
        for p, _ in self.procs:
            p.join(max(0.0, deadline - time.monotonic()))
        self._kill()

    # ---- the protocol's methods ------------------------------------------------------------

    def info(self):
        self._ensure()
        out = dict(self.infos[0])
        out.pop("rank", None)
        out["ranks"] = self.world
        out["shard"] = self.options["shard"]
        out["activation_checkpointing"] = self.options["activation_checkpointing"]
        out["devices"] = [dict(i["rank"], device_name=i["device_name"], device_memory_bytes=i["device_memory_bytes"]) for i in self.infos]
        return out

    def init(self, seed, out):
        return self._call("init", {"seed": seed, "out": out})[0]

    def load(self, pack):
        r = self._call("load", {"pack": pack})[0]
        self.loaded, self.lost_load = True, False
        return r

    def export(self, out):
        if self.lost_load:
            raise BadRequest("export: the ranks were restarted since load, and the parameters it set are lost: load the pack again")
        return self._call("export", {"out": out})[0]

    def train(self, **params):
        rs = self._call("train", params, watch=True)
        out = dict(rs[0])
        ranks = [r.pop("rank") for r in rs]
        out.pop("rank", None)
        out["samples"] = sum(r["samples"] for r in rs)
        out["seconds"] = max(r["seconds"] for r in rs)
        metrics = dict(out["metrics"])
        metrics["samples_per_second"] = out["samples"] / out["seconds"] if out["seconds"] > 0 else 0.0
        mem = [r["max_memory_allocated_bytes"] for r in ranks if "max_memory_allocated_bytes" in r]
        if mem:
            metrics["device_max_memory_allocated_bytes"] = float(max(mem))
        out["metrics"] = metrics
        out["ranks"] = ranks
        out["idle_ranks"] = sum(1 for r in ranks if r.get("idle"))
        return out

    def evaluate(self, pack=None):
        return self._call("evaluate", {"pack": pack})[0]

    def probe(self, shards=(), steps=5):
        rs = self._call("probe", {"shards": list(shards), "steps": steps}, watch=True)
        out = dict(rs[0])
        out.pop("rank", None)
        out["samples_per_second"] = sum(r["samples_per_second"] for r in rs)
        out["seconds_per_step"] = max(r["seconds_per_step"] for r in rs)
        return out
