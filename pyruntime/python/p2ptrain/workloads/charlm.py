"""A byte-level language model on the Python standard library's own sources.

Factory ``p2ptrain.workloads.charlm:CharLM``. The corpus is the concatenation of the stdlib's
``.py`` files (``sysconfig.get_paths()["stdlib"]``, walked in sorted order, skipping
``site-packages``/``dist-packages``), cut to the first ``corpus_bytes`` bytes. The last
``holdout`` fraction is held out for ``evaluate``; the rest is cut into shard files of
``shard_bytes`` raw bytes (``shard-NNNNN.txt``). The corpus depends on the interpreter's
version, so held-out metrics are comparable between nodes running the same Python.

Config keys (defaults): ``corpus_bytes`` (1_000_000), ``holdout`` (0.1), ``shard_bytes``
(65536), ``seq_len`` (64), ``batch_size`` (32), ``embed`` (64), ``hidden`` (256), ``lr``
(3e-3, AdamW), ``eval_bytes`` (65536: how much of the held-out text ``evaluate`` scores).

Model: embedding(256, embed) -> 1-layer GRU(hidden) -> linear(256), about 330K parameters at
the defaults. ``evaluate`` returns ``loss`` (nats/char), ``bits_per_char`` and ``accuracy``
(next-byte top-1).
"""

import math
import os
import sysconfig

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..workload import Workload
from .shards import shard_name, write_examples

_SKIP_DIRS = {"site-packages", "dist-packages", "__pycache__"}


def corpus(limit):
    """The first ``limit`` bytes of the stdlib's .py sources in sorted path order."""
    root = sysconfig.get_paths()["stdlib"]
    out, total = [], 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for fn in sorted(filenames):
            if not fn.endswith(".py"):
                continue
            try:
                with open(os.path.join(dirpath, fn), "rb") as f:
                    # f.read(n) allocates n bytes up front: read the file, then cut.
                    data = f.read()[: limit - total]
            except OSError:
                continue
            out.append(data)
            total += len(data)
            if total >= limit:
                return b"".join(out)
    return b"".join(out)


class CharGRU(nn.Module):
    def __init__(self, embed, hidden):
        super().__init__()
        self.embed = nn.Embedding(256, embed)
        self.rnn = nn.GRU(embed, hidden, batch_first=True)
        self.head = nn.Linear(hidden, 256)

    def forward(self, x):
        h, _ = self.rnn(self.embed(x))
        return self.head(h)


class CharLM(Workload):
    def __init__(self, config):
        super().__init__(config)
        c = self.config
        self.corpus_bytes = int(c.get("corpus_bytes", 1_000_000))
        self.holdout = float(c.get("holdout", 0.1))
        self.shard_bytes = int(c.get("shard_bytes", 65536))
        self.seq_len = int(c.get("seq_len", 64))
        self.batch_size = int(c.get("batch_size", 32))
        self.embed = int(c.get("embed", 64))
        self.hidden = int(c.get("hidden", 256))
        self.lr = float(c.get("lr", 3e-3))
        self.eval_bytes = int(c.get("eval_bytes", 65536))
        if min(self.corpus_bytes, self.shard_bytes, self.seq_len, self.batch_size) <= 0 or not 0 < self.holdout < 1:
            raise ValueError(f"bad charlm config {c}")
        self._cache = (None, None)
        self._heldout = None

    def split(self):
        text = corpus(self.corpus_bytes)
        if len(text) < 4 * (self.seq_len + 1):
            raise ValueError(f"stdlib corpus is only {len(text)} bytes")
        cut = int(len(text) * (1 - self.holdout))
        return text[:cut], text[cut:]

    def build_model(self):
        return CharGRU(self.embed, self.hidden)

    def build_optimizer(self, model):
        return torch.optim.AdamW(model.parameters(), lr=self.lr)

    def _data(self, shard_paths):
        key = tuple(shard_paths)
        if self._cache[0] != key:
            parts = []
            for p in shard_paths:
                with open(p, "rb") as f:
                    parts.append(f.read())
            data = np.frombuffer(b"".join(parts), dtype=np.uint8)
            if len(data) < self.seq_len + 2:
                raise ValueError(f"{len(shard_paths)} shard(s) hold {len(data)} bytes, fewer than seq_len+2")
            self._cache = (key, torch.from_numpy(data.astype(np.int64)))
        return self._cache[1]

    def batches(self, shard_paths):
        data = self._data(shard_paths)
        T = self.seq_len
        n_batches = max(1, (len(data) - 1) // (T * self.batch_size))
        span = torch.arange(T + 1)
        for _ in range(n_batches):
            off = torch.randint(0, len(data) - T - 1, (self.batch_size,))
            w = data[off[:, None] + span]
            yield w[:, :-1], w[:, 1:]

    def loss(self, model, batch):
        x, y = batch
        return F.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))

    def evaluate(self, model):
        if self._heldout is None:
            _, held = self.split()
            held = np.frombuffer(held[: self.eval_bytes], dtype=np.uint8).astype(np.int64)
            n = (len(held) - 1) // self.seq_len
            idx = np.arange(n)[:, None] * self.seq_len + np.arange(self.seq_len + 1)
            self._heldout = torch.from_numpy(held[idx])
        windows = self._heldout
        dev = self.device or "cpu"
        total_loss, correct, count = 0.0, 0, 0
        for lo in range(0, len(windows), 256):
            w = windows[lo : lo + 256].to(dev)
            logits = model(w[:, :-1]).reshape(-1, 256)
            y = w[:, 1:].reshape(-1)
            total_loss += float(F.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(dim=1) == y).sum())
            count += y.numel()
        loss = total_loss / max(count, 1)
        return {"loss": loss, "bits_per_char": loss / math.log(2), "accuracy": correct / max(count, 1)}

    @classmethod
    def prepare_dataset(cls, config, out_dir):
        w = cls(config)
        train, _ = w.split()
        counts = {}
        for i, lo in enumerate(range(0, len(train), w.shard_bytes)):
            chunk = train[lo : lo + w.shard_bytes]
            name = shard_name(i, "txt")
            tmp = os.path.join(out_dir, f".{name}.tmp")
            with open(tmp, "wb") as f:
                f.write(chunk)
            os.replace(tmp, os.path.join(out_dir, name))
            counts[name] = len(chunk) // w.seq_len
        write_examples(out_dir, counts)
