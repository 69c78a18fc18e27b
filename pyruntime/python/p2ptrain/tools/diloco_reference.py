"""DiLoCo on digits in plain PyTorch, without the node: what DiLoCo itself costs.

    cd pyruntime/python
    python3 -m p2ptrain.tools.diloco_reference --seeds 1,2,3 --rounds 30 --h 20 --workers 3 \\
        --outer 1.0:0.5:nesterov --outer 0.7:0.9:nesterov

For every seed it trains the digits MLP (``p2ptrain.workloads.digits``: its split, model,
AdamW, loss and held-out evaluation, imported, not copied) two ways from the same
initial parameters and prints held-out accuracy and loss after every round:

- **DiLoCo** (one run per ``--outer``): K workers each load the global parameters, run H
  AdamW steps on their own microshards, and send the pseudo-gradient global − local; the
  pseudo-gradients are averaged weighted by the examples each worker read (the node's
  merge weight, ``samples``) and ``torch.optim.SGD`` (lr, momentum, Nesterov, dampening 0)
  takes the outer step on the global parameters. Its momentum lives across rounds.
- **one node**: one worker, K·H steps a round over the K workers' microshards, outer lr 1
  and momentum 0, so the global parameters are the worker's own: plain training.

Every worker keeps its own AdamW (moments and step count) from round to round, as a node's
trainer does: the node passes the state of its previous window in (``opt_in``) and the
worker rebuilds the optimizer and loads it (``session.Session.train``); keeping the
optimizer object is the same thing without the file.

Data, as the node leases it (demo settings: ``dataset.microshard_bytes`` 16384,
``examples_per_shard`` 64): a microshard is one shard file, 64 consecutive train rows in
``load_split``'s order (23 microshards, the last 30 rows). Each epoch shuffles the
microshards (seeded; the node ranks them by a hash of the epoch) and deals them out: a
worker's share is the microshards an H-step window reads without repeating an example
(``lease.WindowShare``: ceil(H·batch·23/1438) = 4 at H 20, batch 12; 12 for the single
node's 60 steps), so a round takes 12 microshards and the epoch's second round the 11
left, as 4, 4 and 3 with 20, 20 and 15 steps (``lease.WindowSteps``: steps scaled by
microshards/share; the single node: 60 then 55). A leftover of at most half a round goes
with the epoch's last full round instead, its windows longer in proportion
(``lease.AbsorbTail``). Within a window the worker's examples are
shuffled with torch's RNG, seeded per window, and cut into batches, reshuffled when
exhausted (the digits workload's ``batches`` under the worker's endless iterator).
Differences from the node: the permutations (torch/numpy seeds here, sha256 ranks and the
node's per-window seeds there); the node's screening, quality weights and codecs (fp32
is exact) play no part; every worker always contributes.
"""

import argparse
import copy
import math
import sys
import time

import numpy as np
import torch

from ..workloads import digits


class Outer:
    """One outer optimizer setting: SGD lr, momentum, Nesterov, and an optional linear
    warm-up of the lr over the first ``warmup`` rounds (round r of W steps at lr·r/W)."""

    def __init__(self, lr, momentum=0.0, nesterov=False, warmup=0):
        if not lr > 0 or not 0 <= momentum < 1 or (nesterov and momentum == 0) or warmup < 0:
            raise ValueError(f"bad outer setting lr {lr} momentum {momentum} nesterov {nesterov} warm-up {warmup}")
        self.lr, self.momentum, self.nesterov, self.warmup = float(lr), float(momentum), bool(nesterov), int(warmup)

    def lr_at(self, r):
        """The outer lr of round r (1-based)."""
        return self.lr * min(1.0, r / self.warmup) if self.warmup else self.lr

    @classmethod
    def parse(cls, s):
        """``lr:momentum[:nesterov|plain][:wN]``, e.g. ``1.0:0.5:nesterov``, ``0.7:0.9:nesterov`` or
        ``1.0:0.5:plain:w4`` (the lr warmed up linearly over the first 4 rounds)."""
        parts = s.split(":")
        warmup = 0
        if len(parts) == 4 and parts[3].startswith("w") and parts[3][1:].isdigit():
            warmup = int(parts[3][1:])
            parts = parts[:3]
        if len(parts) not in (2, 3) or (len(parts) == 3 and parts[2] not in ("nesterov", "plain")):
            raise argparse.ArgumentTypeError(f"--outer {s!r}: want lr:momentum[:nesterov|plain][:wROUNDS]")
        try:
            return cls(float(parts[0]), float(parts[1]), len(parts) == 3 and parts[2] == "nesterov", warmup)
        except ValueError as e:
            raise argparse.ArgumentTypeError(f"--outer {s!r}: {e}") from None

    def __str__(self):
        return (f"outer lr {self.lr:g}, momentum {self.momentum:g}{', Nesterov' if self.nesterov else ''}"
                + (f", lr warm-up {self.warmup} rounds" if self.warmup else ""))


def microshards(n_train, per_shard):
    """Row ranges ``[lo, hi)`` of the microshards: shard files of ``per_shard`` rows in order."""
    return [(lo, min(lo + per_shard, n_train)) for lo in range(0, n_train, per_shard)]


def window_share(h, batch, n_shards, n_examples, workers, per_trainer):
    """Microshards per worker as ``lease.WindowShare`` sizes them."""
    need = -(-h * batch * n_shards // n_examples)
    if need <= per_trainer or need * workers > n_shards:
        return per_trainer
    return need


def go_round(x):
    """``math.Round`` of Go for x ≥ 0: halves away from zero."""
    return int(math.floor(x + 0.5))


class Plan:
    """The epoch's microshards dealt to workers round by round (see the module doc)."""

    def __init__(self, n_shards, workers, share, h, seed):
        self.n_shards, self.workers, self.share, self.h = n_shards, workers, share, h
        self.rng = np.random.RandomState(seed)
        self.left = []

    def next_round(self):
        """``[(microshard indices, steps)]`` per worker; a worker with nothing gets ``([], 0)``."""
        if not self.left:
            self.left = list(self.rng.permutation(self.n_shards))
        # lease.AbsorbTail: the epoch's last full round takes a leftover of up to half a
        # round with it, and lease.WindowSteps lengthens those windows to match.
        n, total, share = len(self.left), self.share * self.workers, self.share
        if total < n and 2 * (n - total) <= total:
            share = -(-self.share * n // total)
        take = min(n, share * self.workers)
        counts = [take // self.workers + (1 if k < take % self.workers else 0) for k in range(self.workers)]
        out = []
        for c in counts:
            got, self.left = self.left[:c], self.left[c:]
            steps = 0 if c == 0 else self.h if c == self.share else max(1, go_round(self.h * c / self.share))
            out.append((sorted(int(i) for i in got), steps))
        return out


def load_global(model, global_model):
    """Copy the global parameters into a worker's model, as a trainer loads its base head."""
    with torch.no_grad():
        for p, g in zip(model.parameters(), global_model.parameters()):
            p.copy_(g)


class Worker:
    """A trainer: its model (loaded from the global parameters each round) and its AdamW."""

    def __init__(self, workload, init_state):
        self.workload = workload
        self.model = workload.build_model()
        self.model.load_state_dict(init_state)
        self.opt = workload.build_optimizer(self.model)

    def train(self, global_model, x, y, steps, seed):
        """H steps from the global parameters on rows (x, y); returns examples read."""
        load_global(self.model, global_model)
        self.model.train()
        torch.manual_seed(seed)
        bs = self.workload.batch_size
        perm, at, samples = torch.randperm(len(y)), 0, 0
        for _ in range(steps):
            if at >= len(y):
                perm, at = torch.randperm(len(y)), 0
            idx = perm[at : at + bs]
            at += bs
            loss = self.workload.loss(self.model, (x[idx], y[idx]))
            if not torch.isfinite(loss):
                raise FloatingPointError(f"loss {float(loss)} at a window of {steps} steps (seed {seed})")
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
            samples += len(idx)
        return samples


def outer_step(global_model, outer_opt, workers_models, weights):
    """Set each global parameter's grad to the weighted mean of (global − local) and step."""
    total = float(sum(weights))
    with torch.no_grad():
        for p, *local in zip(global_model.parameters(), *(m.parameters() for m in workers_models)):
            g = torch.zeros_like(p)
            for q, w in zip(local, weights):
                g.add_(p - q, alpha=w / total)
            p.grad = g
    outer_opt.step()
    outer_opt.zero_grad(set_to_none=True)


def diloco(workload, global_model, outer, ws, plan, rounds, seed, train, on_round=None):
    """The rounds themselves, shared with the lm reference (``diloco_lm_reference``): each
    round ``plan`` deals the microshards, ``train(worker, microshards, steps, window_seed)``
    trains a worker's window from ``global_model`` and returns the samples it read, the
    pseudo-gradients are averaged weighted by those and ``outer`` steps ``global_model``.
    Returns the held-out metrics after every round."""
    outer_opt = torch.optim.SGD(global_model.parameters(), lr=outer.lr, momentum=outer.momentum, nesterov=outer.nesterov)
    curve = []
    for r in range(1, rounds + 1):
        trained, weights = [], []
        for k, (got, steps) in enumerate(plan.next_round()):
            if steps == 0:
                continue
            weights.append(train(ws[k], got, steps, seed * 1_000_003 + r * 1009 + k))
            trained.append(ws[k].model)
        for g in outer_opt.param_groups:
            g["lr"] = outer.lr_at(r)
        outer_step(global_model, outer_opt, trained, weights)
        global_model.eval()
        with torch.no_grad():
            m = workload.evaluate(global_model)
        curve.append(m)
        if on_round:
            on_round(r, m)
    return curve


def run(workload, x, y, init_state, workers, h, outer, seed, rounds, per_trainer, per_shard, on_round=None):
    """Train ``rounds`` rounds of DiLoCo (``workers`` × ``h`` steps, ``outer``); returns the
    held-out metrics after every round, ``[{"accuracy", "loss"}]``."""
    shards = microshards(len(y), per_shard)
    share = window_share(h, workload.batch_size, len(shards), len(y), workers, per_trainer)
    plan = Plan(len(shards), workers, share, h, seed)
    global_model = workload.build_model()
    global_model.load_state_dict(init_state)

    def train(worker, got, steps, window_seed):
        rows = np.concatenate([np.arange(*shards[i]) for i in got])
        return worker.train(global_model, x[rows], y[rows], steps, window_seed)

    ws = [Worker(workload, init_state) for _ in range(workers)]
    return diloco(workload, global_model, outer, ws, plan, rounds, seed, train, on_round)


def window_mean(curve, lo, hi):
    """Mean accuracy and loss over rounds lo..hi (1-based, inclusive)."""
    sel = curve[lo - 1 : hi]
    return sum(m["accuracy"] for m in sel) / len(sel), sum(m["loss"] for m in sel) / len(sel)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m p2ptrain.tools.diloco_reference", description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", default="1,2,3", help="comma-separated seeds (model init, data order)")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--h", type=int, default=20, help="inner steps per worker per round")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--batch", type=int, default=12)
    ap.add_argument("--lr", type=float, default=0.001, help="inner AdamW lr")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--outer", type=Outer.parse, action="append",
                    help="lr:momentum[:nesterov|plain][:wROUNDS] (wROUNDS: the lr warmed up linearly over that many rounds), repeatable (default 1.0:0.5:nesterov, the demo's)")
    ap.add_argument("--per-trainer", type=int, default=3, help="lease.microshards_per_trainer before WindowShare raises it")
    ap.add_argument("--examples-per-shard", type=int, default=64, help="rows per microshard")
    ap.add_argument("--window", default="21-30", help="rounds averaged in the summary, lo-hi")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--quiet", action="store_true", help="summaries only, no per-round tables")
    a = ap.parse_args(argv)
    outers = a.outer or [Outer(1.0, 0.5, True)]
    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    lo, hi = (int(v) for v in a.window.split("-"))
    if not 1 <= lo <= hi <= a.rounds:
        ap.error(f"--window {a.window} is not within rounds 1..{a.rounds}")
    torch.set_num_threads(a.threads)
    workload = digits.Digits({"hidden": a.hidden, "batch_size": a.batch, "lr": a.lr})
    xtr, ytr, _, _ = digits.load_split(workload.holdout, workload.split_seed)
    x, y = torch.from_numpy(xtr), torch.from_numpy(ytr)
    print(f"digits: hidden {a.hidden}, batch {a.batch}, AdamW lr {a.lr:g}; {a.workers} workers x H={a.h} "
          f"vs one node x {a.workers * a.h} steps a round; {a.rounds} rounds; mean over rounds {lo}-{hi}")
    summary = {str(o): [] for o in outers}
    t0 = time.perf_counter()
    for seed in seeds:
        torch.manual_seed(seed)
        init = copy.deepcopy(workload.build_model().state_dict())
        base = run(workload, x, y, init, 1, a.workers * a.h, Outer(1.0), seed, a.rounds,
                   a.per_trainer * a.workers, a.examples_per_shard)
        b_acc, b_loss = window_mean(base, lo, hi)
        for o in outers:
            dl = run(workload, x, y, init, a.workers, a.h, o, seed, a.rounds, a.per_trainer, a.examples_per_shard)
            d_acc, d_loss = window_mean(dl, lo, hi)
            summary[str(o)].append((seed, d_acc, b_acc, d_loss, b_loss))
            if not a.quiet:
                print(f"\n### seed {seed}, {o}\n")
                print("| round | DiLoCo acc | one node acc | DiLoCo loss | one node loss |\n|---|---|---|---|---|")
                for r, (d, b) in enumerate(zip(dl, base), 1):
                    print(f"| {r} | {100 * d['accuracy']:.2f} | {100 * b['accuracy']:.2f} | {d['loss']:.4f} | {b['loss']:.4f} |")
            print(f"seed {seed}, {o}: rounds {lo}-{hi} mean accuracy DiLoCo {100 * d_acc:.2f} %, one node "
                  f"{100 * b_acc:.2f} %, gap {100 * (d_acc - b_acc):+.2f} points; loss {d_loss:.4f} vs {b_loss:.4f}")
            sys.stdout.flush()
    print(f"\n## Summary: mean held-out accuracy over rounds {lo}-{hi} ({time.perf_counter() - t0:.0f} s)\n")
    print("| outer | seed | DiLoCo % | one node % | gap (points) | DiLoCo loss | one node loss |\n|---|---|---|---|---|---|---|")
    for o, rows in summary.items():
        for seed, d, b, dl, bl in rows:
            print(f"| {o} | {seed} | {100 * d:.2f} | {100 * b:.2f} | {100 * (d - b):+.2f} | {dl:.4f} | {bl:.4f} |")
        n = len(rows)
        d, b = sum(r[1] for r in rows) / n, sum(r[2] for r in rows) / n
        dl, bl = sum(r[3] for r in rows) / n, sum(r[4] for r in rows) / n
        print(f"| {o} | mean | {100 * d:.2f} | {100 * b:.2f} | {100 * (d - b):+.2f} | {dl:.4f} | {bl:.4f} |")


if __name__ == "__main__":
    main()
