#!/usr/bin/python3
"""`make learn`: how the swarm learns on lm tiny, beside plain-PyTorch DiLoCo and one node.

For every codec, overlap setting and seed it runs `p2pnode demo --workload lm` (one validator
and TRAINERS trainers, real processes over loopback TCP) and reads the validator's held-out
loss per round; for every seed it runs `p2ptrain.tools.diloco_lm_reference` with the demo's
settings (H = the demo's inner steps, the preset's own decay, two microshards a trainer before
lease.WindowShare raises it, the lm demo's fp32 outer step) for plain-PyTorch DiLoCo and one
node with the same samples, and with the sparse codec among the codecs that DiLoCo again
with every update through the sparse codec in PyTorch (outer lr 1.5 and the top-k warm-up,
as the demo's; p2ptrain.tools.sparse_reference), which the sparse rows are compared with. It prints per-round held-out loss (mean over seeds) and the gaps
as Markdown tables, the mean over the last third of the rounds, the largest round-over-round
rise after round 3 of every run, and writes every run's losses (learn.json) and a plot
(learn.png, when matplotlib imports). The reference and the node share the model class, the
data split and the preset, not the initial weights or batch orders: compare means over seeds.

    scripts/learn.py --bin bin/p2pnode --seeds 1,2,3 --rounds 12 --trainers 2 \\
        --codecs fp32,sparse --overlap none,eager --out .p2pnode/learn
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time

ROUND = re.compile(r"^round\s+(\d+)/\d+.*held-out loss\s+([\d.]+)")
REF = re.compile(r"^seed (\d+) (.+) round (\d+): loss ([\d.]+)")
ONE_NODE = "one node"
REFERENCE = "reference DiLoCo"
REFERENCE_SPARSE = "reference DiLoCo sparse"
# The lm demo's outer step with the sparse codec (config.OuterLRFor: lr 1.5).
DEMO_OUTER_SPARSE = "1.5:0.5:nesterov"
# The lm demo's settings that the reference must share (demo.WriteConfigs).
DEMO_H = 20
DEMO_PER_TRAINER = 2
# The lm demo's outer step with fp32: heavy ball (demo.WriteConfigs).
DEMO_OUTER = "1.0:0.5:plain"


def csv(text):
    return [s.strip() for s in text.split(",") if s.strip()]


def label(codec, overlap):
    return codec if overlap == "none" else f"{codec}+{overlap}"


def run_swarm(a, codec, overlap, seed, log):
    """One demo swarm; returns its held-out loss per round (1…rounds)."""
    d = os.path.join(a.out, f"{label(codec, overlap)}-seed{seed}")
    cmd = [a.bin, "demo", "--workload", "lm", "--preset", a.preset, "--trainers", str(a.trainers),
           "--rounds", str(a.rounds), "--seed", str(seed), "--codec", codec, "--dir", d]
    if overlap != "none":
        cmd += ["--overlap", overlap]
    losses = {}
    with open(d + ".out", "w") as f:
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in p.stdout:
            f.write(line)
            m = ROUND.match(line)
            if m and int(m.group(1)) > 0:
                losses[int(m.group(1))] = float(m.group(2))
                log(f"  {label(codec, overlap)} seed {seed} round {m.group(1)}: {m.group(2)}")
        if p.wait() != 0:
            raise SystemExit(f"learn: {' '.join(cmd)} failed (exit {p.returncode}); see {d}.out and {d}/*.log")
    missing = [r for r in range(1, a.rounds + 1) if r not in losses]
    if missing:
        raise SystemExit(f"learn: {label(codec, overlap)} seed {seed}: no held-out loss for rounds {missing}; see {d}.out")
    return [losses[r] for r in range(1, a.rounds + 1)]


def run_reference(a, seed, log, sparse=False):
    """The plain-PyTorch reference for one seed: {REFERENCE: losses, ONE_NODE: losses}, or
    with sparse its DiLoCo through the sparse codec alone: {REFERENCE_SPARSE: losses}."""
    cmd = [a.python, "-m", "p2ptrain.tools.diloco_lm_reference", "--preset", a.preset, "--seeds", str(seed),
           "--rounds", str(a.rounds), "--h", str(DEMO_H), "--workers", str(a.trainers),
           "--per-trainer", str(DEMO_PER_TRAINER), "--decay", "preset"]
    if sparse:
        cmd += ["--outer", DEMO_OUTER_SPARSE, "--codec", "sparse", "--no-one-node"]
        got = {REFERENCE_SPARSE: {}}
    else:
        cmd += ["--outer", DEMO_OUTER]
        got = {REFERENCE: {}, ONE_NODE: {}}
    out = os.path.join(a.out, f"reference{'-sparse' if sparse else ''}-seed{seed}.out")
    with open(out, "w") as f:
        p = subprocess.Popen(cmd, cwd=a.pydir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for line in p.stdout:
            f.write(line)
            m = REF.match(line)
            if m:
                which = ONE_NODE if m.group(2) == ONE_NODE else (REFERENCE_SPARSE if sparse else REFERENCE)
                got[which][int(m.group(3))] = float(m.group(4))
                log(f"  {which} seed {seed} round {m.group(3)}: {m.group(4)}")
        if p.wait() != 0:
            raise SystemExit(f"learn: {' '.join(cmd)} failed (exit {p.returncode}); see {out}")
    for k, v in got.items():
        if sorted(v) != list(range(1, a.rounds + 1)):
            raise SystemExit(f"learn: reference seed {seed}: {k} has rounds {sorted(v)}; see {out}")
    return {k: [v[r] for r in range(1, a.rounds + 1)] for k, v in got.items()}


def mean(xs):
    return sum(xs) / len(xs)


def pct(x, base):
    return f"{100 * (x / base - 1):+.1f} %"


def report(a, runs, seeds, out):
    """Markdown tables from runs: {label: {seed: [loss per round]}}."""
    names = list(runs)
    means = {n: [mean([runs[n][s][r] for s in seeds]) for r in range(a.rounds)] for n in names}
    swarms = [n for n in names if n not in (REFERENCE, REFERENCE_SPARSE, ONE_NODE)]
    base = swarms[0] if swarms else None
    w = out.write
    w(f"\n## Held-out loss per round, mean over seeds {','.join(map(str, seeds))} "
      f"(lm {a.preset}, {a.trainers} trainers, H {DEMO_H})\n\n")
    gaps = [(n, REFERENCE_SPARSE if n.startswith("sparse") and REFERENCE_SPARSE in runs else REFERENCE) for n in swarms]
    gaps += [(n, ONE_NODE) for n in swarms + [REFERENCE]]
    gaps += [(n, base) for n in swarms[1:]]
    w("| round | " + " | ".join(names) + " | " + " | ".join(f"{n} / {b}" for n, b in gaps) + " |\n")
    w("|---" * (1 + len(names) + len(gaps)) + "|\n")
    for r in range(a.rounds):
        cells = [f"{means[n][r]:.4f}" for n in names] + [pct(means[n][r], means[b][r]) for n, b in gaps]
        w(f"| {r + 1} | " + " | ".join(cells) + " |\n")
    lo = a.rounds - max(1, a.rounds // 3)  # at least the last round
    w(f"\n## Mean over rounds {lo + 1}-{a.rounds} (the last third), per seed\n\n")
    w("| run | " + " | ".join(f"seed {s}" for s in seeds) + " | mean | / reference | / one node |"
      + (f" / {base} |" if base else "") + "\n")
    w("|---" * (4 + len(seeds) + (1 if base else 0)) + "|\n")
    last = {n: {s: mean(runs[n][s][lo:]) for s in seeds} for n in names}
    for n in names:
        m = mean(list(last[n].values()))
        row = [f"{last[n][s]:.4f}" for s in seeds] + [f"{m:.4f}", pct(m, mean(list(last[REFERENCE].values()))),
                                                      pct(m, mean(list(last[ONE_NODE].values())))]
        if base:
            row.append(pct(m, mean(list(last[base].values()))))
        w(f"| {n} | " + " | ".join(row) + " |\n")
    w("\n## Largest rise of held-out loss over the round before, after round 3 (per seed)\n\n")
    w("| run | " + " | ".join(f"seed {s}" for s in seeds) + " |\n" + "|---" * (1 + len(seeds)) + "|\n")
    for n in names:
        cells = []
        for s in seeds:
            xs = runs[n][s]
            rises = [(xs[r] / xs[r - 1] - 1, r + 1) for r in range(3, len(xs))]
            cells.append("-" if not rises else "{:+.1f} % (round {})".format(100 * max(rises)[0], max(rises)[1]))
        w(f"| {n} | " + " | ".join(cells) + " |\n")
    return means


def plot(a, means, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as e:
        return f"no plot: matplotlib does not import ({e}); `apt-get install python3-matplotlib`"
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    rounds = list(range(1, a.rounds + 1))
    for n, ys in means.items():
        style = "--" if n in (REFERENCE, REFERENCE_SPARSE, ONE_NODE) else "-"
        ax1.plot(rounds, ys, style, marker=".", label=n)
        ax2.plot(rounds, [100 * (y / o - 1) for y, o in zip(ys, means[ONE_NODE])], style, marker=".", label=n)
    ax1.set(xlabel="round", ylabel="held-out loss (nats per byte)", title=f"lm {a.preset}, {a.trainers} trainers, H {DEMO_H}")
    ax2.set(xlabel="round", ylabel="% above one node", title="gap to one node (same samples)")
    ax2.axhline(0, color="grey", lw=0.5)
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return f"plot: {path}"


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser(prog="scripts/learn.py", description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(here, "..", "bin", "p2pnode"))
    ap.add_argument("--python", default="/usr/bin/python3", help="the interpreter with torch (the reference)")
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--rounds", type=int, default=12)
    ap.add_argument("--trainers", type=int, default=2)
    ap.add_argument("--codecs", default="fp32,sparse")
    ap.add_argument("--overlap", default="none", help="none and/or eager (comma-separated)")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--out", default=".p2pnode/learn")
    ap.add_argument("--quiet", action="store_true", help="no per-round progress on stderr")
    a = ap.parse_args(argv)
    seeds = [int(s) for s in csv(a.seeds)]
    codecs, overlaps = csv(a.codecs), csv(a.overlap)
    for o in overlaps:
        if o not in ("none", "eager"):
            ap.error(f"--overlap {o!r}: want none or eager")
    if not seeds or not codecs or not overlaps or a.rounds < 1 or a.trainers < 1:
        ap.error("need at least one seed, codec and overlap setting, and rounds and trainers >= 1")
    a.bin = os.path.abspath(a.bin)
    a.out = os.path.abspath(a.out)
    a.pydir = os.path.join(here, "..", "pyruntime", "python")
    os.makedirs(a.out, exist_ok=True)

    def log(msg):
        if not a.quiet:
            print(msg, file=sys.stderr, flush=True)

    t0 = time.time()
    runs = {}
    for codec in codecs:
        for o in overlaps:
            for s in seeds:
                t = time.time()
                log(f"learn: swarm {label(codec, o)} seed {s}")
                runs.setdefault(label(codec, o), {})[s] = run_swarm(a, codec, o, s, log)
                log(f"learn: swarm {label(codec, o)} seed {s}: {time.time() - t:.0f} s")
    for s in seeds:
        t = time.time()
        log(f"learn: reference seed {s}")
        for k, v in run_reference(a, s, log).items():
            runs.setdefault(k, {})[s] = v
        log(f"learn: reference seed {s}: {time.time() - t:.0f} s")
        if "sparse" in codecs:
            t = time.time()
            log(f"learn: reference with the sparse codec, seed {s}")
            for k, v in run_reference(a, s, log, sparse=True).items():
                runs.setdefault(k, {})[s] = v
            log(f"learn: reference with the sparse codec, seed {s}: {time.time() - t:.0f} s")
    with open(os.path.join(a.out, "learn.json"), "w") as f:
        json.dump({"preset": a.preset, "trainers": a.trainers, "rounds": a.rounds, "h": DEMO_H, "seeds": seeds,
                   "held_out_loss": {n: {str(s): v for s, v in by.items()} for n, by in runs.items()}}, f, indent=1)
    means = report(a, runs, seeds, sys.stdout)
    print(f"\n{plot(a, means, os.path.join(a.out, 'learn.png'))}; losses: {os.path.join(a.out, 'learn.json')}")
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    print(f"learn: {time.time() - t0:.0f} s wall, load average {load}")


if __name__ == "__main__":
    main()
