"""Handwritten digits (sklearn's bundled 8x8 images; no download) with a small MLP.

Factory ``p2ptrain.workloads.digits:Digits``. Config keys (defaults):

- ``hidden`` (128): width of the two hidden layers (64 -> hidden -> hidden -> 10)
- ``batch_size`` (32), ``lr`` (1e-3), ``weight_decay`` (0.01): AdamW inner optimizer
- ``holdout`` (0.2), ``split_seed`` (0): the held-out split, a fixed permutation of the
  1797 images; held-out images never reach a shard
- ``examples_per_shard`` (64): train examples per shard file

Shards are ``shard-NNNNN.npz`` with ``x`` float32 [n, 64] (pixels / 16) and ``y`` int64 [n],
written deterministically and read with ``allow_pickle=False``. ``evaluate`` returns
``accuracy`` and ``loss`` (mean cross-entropy) on the held-out split.
"""

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..workload import Workload
from .shards import read_npz, shard_name, write_examples, write_npz


def split_indices(n, holdout=0.2, split_seed=0):
    """``(train, test)`` example indices: a fixed permutation, the first ``holdout`` held out."""
    perm = np.random.RandomState(split_seed).permutation(n)
    n_test = int(round(n * holdout))
    return perm[n_test:], perm[:n_test]


def load_all():
    """All 1797 images as ``(x float32 [n, 64] in [0, 1], y int64 [n])``."""
    from sklearn.datasets import load_digits

    d = load_digits()
    return (d.data / 16.0).astype(np.float32), d.target.astype(np.int64)


def load_split(holdout=0.2, split_seed=0):
    """``(x_train, y_train, x_test, y_test)``; train rows in the fixed shuffled order."""
    x, y = load_all()
    train, test = split_indices(len(y), holdout, split_seed)
    return x[train], y[train], x[test], y[test]


class Digits(Workload):
    def __init__(self, config):
        super().__init__(config)
        c = self.config
        self.hidden = int(c.get("hidden", 128))
        self.batch_size = int(c.get("batch_size", 32))
        self.lr = float(c.get("lr", 1e-3))
        self.weight_decay = float(c.get("weight_decay", 0.01))
        self.holdout = float(c.get("holdout", 0.2))
        self.split_seed = int(c.get("split_seed", 0))
        if self.hidden <= 0 or self.batch_size <= 0 or not 0 < self.holdout < 1:
            raise ValueError(f"bad digits config {c}")
        self._test = None
        self._cache = (None, None, None)

    def build_model(self):
        h = self.hidden
        return nn.Sequential(nn.Linear(64, h), nn.ReLU(), nn.Linear(h, h), nn.ReLU(), nn.Linear(h, 10))

    def build_optimizer(self, model):
        return torch.optim.AdamW(model.parameters(), lr=self.lr, weight_decay=self.weight_decay)

    def _load(self, shard_paths):
        key = tuple(shard_paths)
        if self._cache[0] != key:
            xs, ys = [], []
            for p in shard_paths:
                x, y = read_npz(p, "x", "y")
                if x.ndim != 2 or x.shape[1] != 64 or x.dtype != np.float32 or y.shape != (x.shape[0],):
                    raise ValueError(f"{p}: not a digits shard (x {x.dtype}{list(x.shape)}, y {y.dtype}{list(y.shape)})")
                xs.append(x)
                ys.append(y.astype(np.int64))
            self._cache = (key, torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys)))
        return self._cache[1], self._cache[2]

    def batches(self, shard_paths):
        x, y = self._load(shard_paths)
        perm = torch.randperm(len(y))
        for lo in range(0, len(y), self.batch_size):
            idx = perm[lo : lo + self.batch_size]
            yield x[idx], y[idx]

    def loss(self, model, batch):
        x, y = batch
        return F.cross_entropy(model(x), y)

    def evaluate(self, model):
        if self._test is None:
            _, _, xt, yt = load_split(self.holdout, self.split_seed)
            self._test = (torch.from_numpy(xt), torch.from_numpy(yt))
        x, y = (t.to(self.device or "cpu") for t in self._test)
        logits = model(x)
        return {
            "accuracy": float((logits.argmax(dim=1) == y).float().mean()),
            "loss": float(F.cross_entropy(logits, y)),
        }

    @classmethod
    def prepare_dataset(cls, config, out_dir):
        w = cls(config)
        per = int(w.config.get("examples_per_shard", 64))
        if per <= 0:
            raise ValueError("examples_per_shard must be positive")
        x, y, _, _ = load_split(w.holdout, w.split_seed)
        counts = {}
        for i, lo in enumerate(range(0, len(y), per)):
            name = shard_name(i, "npz")
            write_npz(f"{out_dir}/{name}", x=x[lo : lo + per], y=y[lo : lo + per])
            counts[name] = int(len(y[lo : lo + per]))
        write_examples(out_dir, counts)
