"""One rank of a multi-device worker: a process that ``ranks.Ranks`` starts with
``torch.multiprocessing``, joined to the others with ``torch.distributed`` (NCCL on GPUs,
gloo on CPUs), running the protocol's methods on its share of the work.

- The window's batch stream is the one a single device would read, drawn with its own RNG
  from the lease's seed, so every rank sees the same stream; at each step rank r trains batch
  ``step × P + r`` of it (P: the ranks that train). The ranks' batches are disjoint, and
  together they are the stream's batches in order, P at a time.
- ``shard: ddp``: ``DistributedDataParallel`` averages the gradients every step (every rank
  holds the whole model); ``shard: fsdp``: FSDP2 (see ``fsdp``).
- A lease whose batches are fewer than the ranks (one pass of ``batches()`` yields P < N)
  trains on P ranks; the others step with their loss weighted 0, which keeps the collectives
  in step and adds nothing, and the trained ranks' losses are scaled by N/P so that the
  averaged gradient is their mean.
- Losses are gathered from every rank at the same steps (every step on a CPU, every 32 on a
  GPU), so a loss that is not finite on one rank stops every rank at the same step, and the
  window fails with ``NonFinite`` without a rank left waiting in a collective.
- Rank 0 writes the packs and the optimizer state; with FSDP the others gather with it.
"""

import collections
import ctypes
import datetime
import os
import random
import signal

import numpy as np
import torch
import torch.distributed as dist

from . import memory, optstate, packs
from .errors import NonFinite
from .session import Session, read_shift, seed_everything


def _rng_state():
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def _set_rng_state(state):
    torch.set_rng_state(state[0])
    random.setstate(state[1])
    np.random.set_state(state[2])


class StreamRNG:
    """The RNG the batch stream is drawn with, apart from the one the model uses (dropout),
    so that every rank draws the same stream whatever its model does in between."""

    def __init__(self, seed):
        saved = _rng_state()
        seed_everything(seed)
        self.state = _rng_state()
        _set_rng_state(saved)

    def draw(self, it):
        saved = _rng_state()
        _set_rng_state(self.state)
        try:
            return next(it)
        finally:
            self.state = _rng_state()
            _set_rng_state(saved)


class RankSession(Session):
    def __init__(self, rank, world, device, store, shard="ddp", timeout=120.0, **kw):
        self.rank, self.world_size = rank, world
        self.shard = shard or "ddp"
        self.store = store
        self.window = 0
        self.idle = False
        dev = torch.device(device)
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        backend = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=float(timeout)))
        # The FSDP module imports what only torch >= 2.4 has: placement.plan refused fsdp
        # on an older torch before any rank started.
        self.fsdp = self.mesh = None
        if self.shard == "fsdp":
            from . import fsdp

            self.fsdp, self.mesh = fsdp, fsdp.mesh(dev.type, world)
        super().__init__(device=str(dev), **kw)

    # ---- the model on this rank -----------------------------------------------------------

    def _place(self, model):
        if self.fsdp:
            # FSDP2 moves each rank's shards to the mesh's device.
            return self.fsdp.shard(model, self._blocks(model), self.mesh)
        return model.to(self.device)

    def _build(self, seed):
        super()._build(seed)
        if not self.fsdp:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            # DDP broadcasts rank 0's parameters and buffers once; gloo cannot send bool
            # buffers (the lm's causal mask), and buffers that are not floating point are
            # the same on every rank anyway (built alike, not in packs).
            fixed = [n for n, b in self.model.named_buffers() if not b.is_floating_point()]
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(self.model, fixed)
            # Nor are buffers broadcast every forward (the mask would cross the wire each
            # step): every rank starts a window from the same pack.
            self.loss_model = DistributedDataParallel(self.model, device_ids=ids, broadcast_buffers=False)

    def _load(self, pack):
        if self.fsdp:
            self.fsdp.load_pack(self.spec, pack)
        else:
            packs.load_pack(self.spec, pack)

    def _export(self, out):
        if self.fsdp:
            self.fsdp.export_pack(self.spec, out, writer=self.rank == 0)
        elif self.rank == 0:
            packs.export_pack(self.spec, out)

    def _save_optimizer(self, opt, path):
        if self.fsdp:
            optstate.save(opt, path, whole=self.fsdp.whole, write=self.rank == 0)
        elif self.rank == 0:
            optstate.save(opt, path)

    def _load_optimizer(self, opt, path):
        optstate.load(opt, path, place=(lambda param, t: self.fsdp.as_sharded(t, param)) if self.fsdp else None)

    def _shift(self, to, base):
        if self.fsdp:
            self.fsdp.shift_pack(self.spec, to, base)
        else:
            packs.shift_pack(self.spec, to, base)

    # ---- a window on this rank ----------------------------------------------------------

    def train(self, **kw):
        self.window += 1
        self.shift_planned = False
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        r = super().train(**kw)
        r["rank"] = self.report(idle=self.idle)
        return r

    def probe(self, shards=(), steps=5):
        r = super().probe(shards, steps)
        r["rank"] = self.report(idle=self.idle)
        return r

    def report(self, **extra):
        """What the coordinator shows of this rank: its device and memory."""
        out = {"rank": self.rank, "device": str(self.device), "pid": os.getpid(), "peak_rss_bytes": memory.peak_rss_bytes()}
        if self.device.type == "cuda":
            out["max_memory_allocated_bytes"] = int(torch.cuda.max_memory_allocated(self.device))
        out.update(extra)
        return out

    def _train_batches(self, shards, seed):
        stream_rng = StreamRNG(seed)
        passes = []
        stream = self._batches(shards, passes)
        world = self.world_size
        # The first pass tells how many ranks the lease's batches can keep busy.
        head = collections.deque(stream_rng.draw(stream) for _ in range(world))
        active = passes[0] if passes and passes[0] < world else world
        self.idle = self.rank >= active
        weight = 0.0 if self.idle else world / active
        if self.rank:
            # The model's own randomness (dropout) differs between ranks, as in any DDP run.
            seed_everything((seed * 1_000_003 + self.rank) % (1 << 63))
        while True:
            group = [head.popleft() if head else stream_rng.draw(stream) for _ in range(active)]
            yield group[self.rank % active], weight

    def _losses(self, pending, weight):
        # [losses of these steps..., 1 if this rank trained] from every rank.
        mine = torch.cat([torch.stack(pending), torch.ones(1, device=pending[0].device) * (1.0 if weight else 0.0)])
        every = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(every, mine)
        rows = torch.stack(every).cpu()
        trained = rows[rows[:, -1] > 0, :-1]
        return trained.mean(dim=0).tolist()

    def _shift_to(self, path, step, steps):
        # Rank 0 sees the request and names the step it applies before: the next one. No rank
        # can be past that step's check yet (it would need this step's collectives, which
        # need rank 0), so every rank moves the model before the same step. The store's
        # counter (add 0 reads it without waiting) holds that step + 1; 0: none.
        at_key, to_key = f"shift-at/{self.window}", f"shift-to/{self.window}"
        if self.rank == 0 and not self.shift_planned and step + 1 < steps and os.path.exists(path):
            self.store.set(to_key, read_shift(path, remove=False))
            self.store.add(at_key, step + 2)
            self.shift_planned = True
        if self.store.add(at_key, 0) != step + 1:
            return None
        if self.rank == 0:
            os.remove(path)
        return self.store.get(to_key).decode()

    def _check_finite(self):
        # Every rank learns whether any rank holds a non-finite value, so that none goes on
        # to write (a collective with FSDP) while another has stopped.
        bad = None
        with torch.no_grad():
            for name, t in self.spec.tensors:
                t = t.to_local() if hasattr(t, "to_local") else t
                if t.numel() and not bool(torch.isfinite(t).all()):
                    bad = name
                    break
        flag = torch.tensor([0.0 if bad is None else 1.0], device=self.device if self.device.type == "cuda" else "cpu")
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if bad is not None:
            raise NonFinite(f"parameter {bad} holds non-finite value(s) after training (rank {self.rank})")
        if flag.item() > 0:
            raise NonFinite("a parameter holds non-finite value(s) after training on another rank")

    def evaluate(self, pack=None):
        if not self.fsdp and self.rank != 0:
            # Rank 0 evaluates alone; the others load the pack too, so that every rank
            # holds the same parameters afterwards.
            if pack:
                self._load(pack)
            return {"metrics": {}}
        return super().evaluate(pack)


# ---- the rank process ---------------------------------------------------------------------


def _die_with_parent():
    """Ask the kernel to kill this process when the coordinator dies (Linux)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def main(rank, world, device, store_port, generation, options, conn):
    """The rank process: join the group, build the session, then serve calls from conn."""
    _die_with_parent()
    from .worker import error_body

    def send(*msg):
        conn.send(msg)

    try:
        store = dist.TCPStore("127.0.0.1", store_port, None, False, datetime.timedelta(seconds=options["timeout"]))
        prefixed = dist.PrefixStore(f"gen{generation}/", store)
        session = RankSession(rank, world, device, prefixed, shard=options["shard"], timeout=options["timeout"],
                              factory=options["factory"], config=options["config"], include=options["include"],
                              exclude=options["exclude"], threads=options["threads"], seed=options["seed"],
                              precision=options["precision"], activation_checkpointing=options["activation_checkpointing"])
        info = session.info()
        info["rank"] = session.report()
        send("ready", info)
    except Exception as e:
        send("err", error_body(e))
        return 1
    session.progress = lambda step: send("progress", step)
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return 0
        if msg[0] == "exit":
            return 0
        _, method, params = msg
        try:
            send("ok", getattr(session, method)(**params))
        except Exception as e:
            send("err", error_body(e))
