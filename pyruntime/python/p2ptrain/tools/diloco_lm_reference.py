"""DiLoCo on the lm workload in plain PyTorch, without the node: what DiLoCo itself costs.

    cd pyruntime/python
    python3 -m p2ptrain.tools.diloco_lm_reference --preset tiny --seeds 1 --rounds 24 --h 100 \\
        --outer 1.0:0.5:plain

The lm counterpart of ``diloco_reference`` (digits), for issue 15 item 6: the transformer of
``p2ptrain.workloads.lm`` (its corpus split, model, ScheduledAdamW, loss and held-out
evaluation, imported, not copied) trained two ways from the same initial parameters, as
``TestLMLearningCheck`` (e2e/lmcheck_test.go) trains it through the node:

- **DiLoCo**: K workers each load the global parameters, run H steps on their microshards
  and send global − local; the pseudo-gradients are averaged weighted by the samples each
  read and ``torch.optim.SGD`` takes the outer step (its momentum lives across rounds);
- **one node**: one worker, K·H steps a round, outer lr 1 and no momentum: plain training.

Each worker keeps its own optimizer (moments and step count) across rounds, as a trainer
does. With ``--decay fit`` (the default, like ``P2PNODE_LM_CHECK_DECAY=fit``) each run's
cosine ends at its own last step: H·rounds for the workers, K·H·rounds for the one node.

Data, as the node leases it: a microshard is one shard file (a ``shard_bytes`` block of the
corpus's training part, ``len // context`` examples); the epoch's microshards are shuffled
and dealt out in shares that ``lease.WindowShare`` sizes (the microshards an H-step window
reads without repeating, where the dataset holds that many; ``diloco_reference.Plan``). A
window draws batches of random ``context + 1`` byte spans from its microshards' bytes with
the workload's own ``window_batch`` (what its ``batches`` yields). Differences from the
node: the permutations and seeds; the node's screening and codecs (fp32 is exact) play no
part; every worker always contributes.
"""

import argparse
import copy
import json
import sys
import time

import torch

from ..workloads import lm
from .diloco_reference import Outer, Plan, diloco, load_global, window_mean, window_share
from .sparse_reference import ErrorFeedback


class Worker:
    """A trainer: its model (loaded from the global parameters each round) and its optimizer."""

    def __init__(self, workload, init_state, device, bf16=False):
        self.workload, self.device, self.bf16 = workload, device, bf16
        self.model = workload.build_model().to(device)
        self.model.load_state_dict(init_state)
        self.opt = workload.build_optimizer(self.model)
        self.feedback = None  # an ErrorFeedback when the updates go through the sparse codec

    def train(self, global_model, data, steps, seed):
        """``steps`` steps from the global parameters on the byte tensor ``data``; returns
        the samples read."""
        load_global(self.model, global_model)
        self.model.train()
        gen = torch.Generator().manual_seed(seed)
        for _ in range(steps):
            x, y = (t.to(self.device) for t in self.workload.window_batch(data, gen))
            # --bf16: the loss under autocast, as the worker's workload.precision bf16 does.
            with torch.autocast(torch.device(self.device).type, dtype=torch.bfloat16, enabled=self.bf16):
                loss = self.workload.loss(self.model, (x, y))
            if not torch.isfinite(loss):
                raise FloatingPointError(f"loss {float(loss)} in a window of {steps} steps (seed {seed})")
            self.opt.zero_grad(set_to_none=True)
            loss.backward()
            self.opt.step()
        return steps * self.workload.batch_size


def run(workload, blocks, init_state, workers, h, outer, seed, rounds, per_trainer, device, on_round=None, bf16=False,
        sparse=None):
    """``rounds`` rounds of DiLoCo (``workers`` × ``h`` steps, ``outer``); returns the held-out
    metrics after every round. ``sparse`` (a dict of ``ErrorFeedback``'s arguments) sends
    every worker's update through the sparse codec with its own error feedback."""
    examples = sum(len(b) // workload.context for b in blocks)
    share = window_share(h, workload.batch_size, len(blocks), examples, workers, per_trainer)
    plan = Plan(len(blocks), workers, share, h, seed)
    global_model = workload.build_model().to(device)
    global_model.load_state_dict(init_state)

    at = {"round": 1}  # the round being trained: the sparse codec's warm-up follows it

    def train(worker, got, steps, window_seed):
        data = torch.frombuffer(bytearray(b"".join(blocks[i] for i in got)), dtype=torch.uint8).long()
        samples = worker.train(global_model, data, steps, window_seed)
        if worker.feedback is not None:
            worker.feedback.send(global_model, worker.model, at["round"])
        return samples

    def closed(r, metrics):
        at["round"] = r + 1
        if on_round:
            on_round(r, metrics)

    ws = [Worker(workload, init_state, device, bf16) for _ in range(workers)]
    for w in ws:
        w.feedback = ErrorFeedback(**sparse) if sparse is not None else None
    return diloco(workload, global_model, outer, ws, plan, rounds, seed, train, closed)


def keys(text):
    """``key=value,key=value`` (values in JSON) as a dict."""
    out = {}
    for kv in filter(None, text.split(",")):
        k, _, v = kv.partition("=")
        out[k] = json.loads(v)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m p2ptrain.tools.diloco_lm_reference", description=__doc__.split("\n")[0])
    ap.add_argument("--preset", default="tiny", help="lm preset (tiny, small, base)")
    ap.add_argument("--config", default="", help="more workload.config keys, key=value,key=value (e.g. eval_bytes=65536)")
    ap.add_argument("--swarm-config", default="",
                    help="workload.config keys for the DiLoCo workers only, over --config: training keys such as "
                         "lr=0.003,warmup=33 (both sides start from one init, so the model's shape must match)")
    ap.add_argument("--seeds", default="1", help="comma-separated seeds (model init, data order)")
    ap.add_argument("--rounds", type=int, default=24)
    ap.add_argument("--h", type=int, default=100, help="inner steps per worker per round")
    ap.add_argument("--workers", type=int, default=3)
    ap.add_argument("--outer", type=Outer.parse, action="append",
                    help="lr:momentum[:nesterov|plain][:wROUNDS] (wROUNDS: the lr warmed up linearly over that many rounds), repeatable (default 1.0:0.5:plain)")
    ap.add_argument("--per-trainer", type=int, default=2, help="lease.microshards_per_trainer before WindowShare raises it")
    ap.add_argument("--decay", choices=("fit", "preset"), default="fit",
                    help="fit: each run's cosine ends at its last step; preset: the preset's decay_steps")
    ap.add_argument("--codec", choices=("fp32", "sparse"), default="fp32",
                    help="how the DiLoCo workers' updates reach the outer step: exact, or the sparse codec "
                         "(p2ptrain.tools.sparse_reference) with error feedback")
    ap.add_argument("--topk", type=int, default=64, help="sparse: values kept per block (protocol.sparse_topk)")
    ap.add_argument("--sparse-block", type=int, default=4096, help="sparse: block length (protocol.sparse_block)")
    ap.add_argument("--feedback-decay", type=float, default=0.95, help="sparse: protocol.sparse_feedback_decay")
    ap.add_argument("--sparse-warmup-rounds", type=int, default=4, help="sparse: protocol.sparse_warmup_rounds (0: none)")
    ap.add_argument("--sparse-warmup-factor", type=float, default=16, help="sparse: protocol.sparse_warmup_factor")
    ap.add_argument("--no-one-node", action="store_true", help="train DiLoCo only (the one-node run is the same "
                    "for every codec and outer setting: `make learn` runs it once)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--bf16", action="store_true", help="train under bf16 autocast (workload.precision: bf16)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    a = ap.parse_args(argv)
    outers = a.outer or [Outer(1.0, 0.5, False)]
    seeds = [int(s) for s in a.seeds.split(",") if s.strip()]
    extra, swarm_extra = keys(a.config), keys(a.swarm_config)
    sparse = None
    if a.codec == "sparse":
        sparse = dict(block=a.sparse_block, k=a.topk, decay=a.feedback_decay, warmup=a.sparse_warmup_rounds,
                      factor=a.sparse_warmup_factor)
        try:
            ErrorFeedback(**sparse)  # bad settings fail here, before any training
        except ValueError as e:
            ap.error(f"--codec sparse: {e}")
    torch.set_num_threads(a.threads)

    def workload(steps_per_round, more=None):
        cfg = {**extra, **(more or {}), "preset": a.preset}
        if a.decay == "fit":
            cfg["decay_steps"] = steps_per_round * a.rounds
        w = lm.LM(cfg)
        w.device = a.device
        return w

    wl, base_wl = workload(a.h, swarm_extra), workload(a.workers * a.h)
    blocks, _ = wl.split()
    lo = min(a.rounds - a.rounds // 3 + 1, a.rounds)
    print(f"lm {a.preset}: {a.workers} workers x H={a.h} vs one node x {a.workers * a.h} steps a round; "
          f"{a.rounds} rounds; decay {a.decay}; {len(blocks)} microshards; mean over rounds {lo}-{a.rounds}"
          + (f"; DiLoCo workers: {swarm_extra}" if swarm_extra else "")
          + (f"; DiLoCo updates through the sparse codec {sparse}" if sparse else ""))
    t0 = time.perf_counter()
    rows = []
    for seed in seeds:
        torch.manual_seed(seed)
        init = copy.deepcopy(wl.build_model().state_dict())
        base = None
        if not a.no_one_node:
            base = run(base_wl, blocks, init, 1, a.workers * a.h, Outer(1.0), seed, a.rounds, a.per_trainer * a.workers,
                       a.device, lambda r, m: print(f"seed {seed} one node round {r}: loss {m['loss']:.4f}", flush=True),
                       a.bf16)
        for o in outers:
            dl = run(wl, blocks, init, a.workers, a.h, o, seed, a.rounds, a.per_trainer, a.device,
                     lambda r, m: print(f"seed {seed} {o} round {r}: loss {m['loss']:.4f}", flush=True), a.bf16, sparse)
            if base is None:
                continue
            print(f"\n### seed {seed}, {o}\n\n| round | DiLoCo loss | one node loss | DiLoCo / one node |\n|---|---|---|---|")
            for r, (d, b) in enumerate(zip(dl, base), 1):
                print(f"| {r} | {d['loss']:.4f} | {b['loss']:.4f} | {100 * (d['loss'] / b['loss'] - 1):+.1f} % |")
            d, b = window_mean(dl, lo, a.rounds)[1], window_mean(base, lo, a.rounds)[1]
            rows.append((o, seed, d, b, dl[-1]["loss"], base[-1]["loss"]))
            sys.stdout.flush()
    if not rows:
        return
    print(f"\n## Summary: held-out loss, mean over rounds {lo}-{a.rounds} and at round {a.rounds} "
          f"({time.perf_counter() - t0:.0f} s)\n")
    print("| outer | seed | DiLoCo | one node | gap | DiLoCo last | one node last | gap last |\n|---|---|---|---|---|---|---|---|")
    for o, seed, d, b, dlast, blast in rows:
        print(f"| {o} | {seed} | {d:.4f} | {b:.4f} | {100 * (d / b - 1):+.2f} % | {dlast:.4f} | {blast:.4f} | "
              f"{100 * (dlast / blast - 1):+.2f} % |")


if __name__ == "__main__":
    main()
