"""A decoder-only transformer language model over bytes, on text every machine has.

Factory ``p2ptrain.workloads.lm:LM``. Written with torch 1.13 built-ins only (Debian's
python3-torch): token and position embeddings, pre-LayerNorm blocks (causal multi-head
self-attention, GELU MLP), a final LayerNorm and an output head tied to the token embedding.
The vocabulary is the 256 byte values.

Presets (``workload.config.preset``), every key overridable one by one:

========  ======  =====  =====  =======  ==========  ======  ==========  ===================
preset    layers  width  heads  context  batch_size  lr      parameters  fp32 pack
========  ======  =====  =====  =======  ==========  ======  ==========  ===================
tiny      5       128    4      128      8           2e-3    1.04 M      4.2 MB
small     6       384    6      256      16          1e-3    10.8 M      43 MB
base      12      768    12     1024     8           6e-4    85.9 M      344 MB
large     20      2048   16     1024     8           3e-4    1.01 B      4.04 GB
========  ======  =====  =====  =======  ==========  ======  ==========  ===================

``base`` is GPT-2 small's shape (12 layers, width 768, 12 heads, context 1024); with a
256-byte vocabulary instead of GPT-2's 50257 tokens its embedding is 38 M parameters
smaller, so it has 86 M parameters rather than 124 M. ``large`` (about 1 B parameters) is
sized for one 24 GB GPU in bf16 with ``workload.activation_checkpointing: true`` (docs/gpu.md),
or for several GPUs with ``workload.shard: fsdp``.

Other keys (defaults): ``warmup`` (preset: 100/200/500/1000 steps), ``decay_steps`` (cosine
horizon in inner steps, preset: 3000/10000/50000/100000), ``min_lr`` (0.1, as a fraction of ``lr``),
``weight_decay`` (0.1, on matrices only), ``betas`` ([0.9, 0.95]), ``grad_clip`` (1.0; 0 turns
it off), ``corpus_bytes`` (tiny: 2 MB, else 0 = the whole corpus), ``shard_bytes`` (65536),
``holdout`` (0.05), ``eval_bytes`` (tiny: 16384, the others: 8192; evaluation is a
forward pass over that much text, so keep it small on CPUs).

``blocks(model)`` names the transformer blocks: the worker checkpoints their activations
(``workload.activation_checkpointing``) and shards them one by one (``workload.shard: fsdp``).

Data. The corpus is the Python standard library's ``.py`` sources (the same text as
``charlm``: about 11 MB under Debian's Python 3.11), cut into blocks of ``shard_bytes``;
every ``round(1/holdout)``-th block is held out, the others become the shard files
``shard-NNNNN.txt`` in order. Holding out spread-out blocks instead of the corpus's tail
keeps the held-out text like the training text (the tail is all ``xml``/``zipfile``).

Inner optimizer: AdamW with linear warm-up then cosine decay. The learning rate is a
function of the optimizer's own step count, which is part of the inner-optimizer state the
worker carries between rounds, so the schedule continues across rounds instead of warming
up again in every window.

``evaluate`` returns held-out ``loss`` (nats per byte-token), ``bits_per_byte`` and
``accuracy`` (next-byte top-1) over the first ``eval_bytes`` of the held-out text.
``model_config`` returns the model's hyperparameters; ``p2pnode export`` writes them as
``config.json`` beside the safetensors, and ``python3 -m p2ptrain.sample`` rebuilds the model
from that file alone.
"""

import math
import os

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..workload import Workload
from .charlm import corpus
from .shards import shard_name, write_examples

VOCAB = 256
MODEL_TYPE = "p2ptrain-lm"

PRESETS = {
    "tiny": dict(layers=5, width=128, heads=4, context=128, batch_size=8, lr=2e-3, warmup=100,
                 decay_steps=3000, corpus_bytes=2_000_000, eval_bytes=16384),
    "small": dict(layers=6, width=384, heads=6, context=256, batch_size=16, lr=1e-3, warmup=200,
                  decay_steps=10000, corpus_bytes=0, eval_bytes=8192),
    "base": dict(layers=12, width=768, heads=12, context=1024, batch_size=8, lr=6e-4, warmup=500,
                 decay_steps=50000, corpus_bytes=0, eval_bytes=8192),
    "large": dict(layers=20, width=2048, heads=16, context=1024, batch_size=8, lr=3e-4, warmup=1000,
                  decay_steps=100000, corpus_bytes=0, eval_bytes=8192),
}
COMMON = dict(weight_decay=0.1, min_lr=0.1, betas=[0.9, 0.95], grad_clip=1.0, shard_bytes=65536, holdout=0.05)
# Keys the worker (not the workload) reads from workload.config; accepted and ignored here.
WORKER_KEYS = {"device", "precision", "dtype", "threads"}
INT_KEYS = {"layers", "width", "heads", "context", "batch_size", "warmup", "decay_steps", "corpus_bytes",
            "eval_bytes", "shard_bytes"}
FLOAT_KEYS = {"lr", "weight_decay", "min_lr", "grad_clip", "holdout"}
# The keys that describe the model itself (what config.json holds).
MODEL_KEYS = ("layers", "width", "heads", "context")


def resolve_config(config):
    """The preset's values overridden by ``config``'s, checked. Errors name the key."""
    config = dict(config or {})
    preset = config.pop("preset", "tiny")
    if preset not in PRESETS:
        raise ValueError(f"workload.config.preset: unknown preset {preset!r} (have {', '.join(PRESETS)})")
    out = dict(COMMON)
    out.update(PRESETS[preset])
    for k, v in config.items():
        if k in WORKER_KEYS:
            continue
        if k not in out:
            raise ValueError(f"workload.config.{k}: unknown key for the lm workload (have preset, {', '.join(sorted(out))})")
        if k in INT_KEYS:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v != int(v):
                raise ValueError(f"workload.config.{k}: {v!r} is not an integer")
            v = int(v)
        elif k in FLOAT_KEYS:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"workload.config.{k}: {v!r} is not a number")
            v = float(v)
        elif k == "betas":
            if not isinstance(v, (list, tuple)) or len(v) != 2 or not all(isinstance(b, (int, float)) and 0 <= b < 1 for b in v):
                raise ValueError(f"workload.config.betas: {v!r} is not two numbers in [0, 1)")
            v = [float(b) for b in v]
        out[k] = v
    out["preset"] = preset
    positive = ("layers", "width", "heads", "context", "batch_size", "shard_bytes", "eval_bytes", "decay_steps")
    for k in positive:
        if out[k] <= 0:
            raise ValueError(f"workload.config.{k}: {out[k]} must be positive")
    for k in ("warmup", "corpus_bytes"):
        if out[k] < 0:
            raise ValueError(f"workload.config.{k}: {out[k]} must not be negative")
    if out["width"] % out["heads"]:
        raise ValueError(f"workload.config.heads: width {out['width']} is not a multiple of heads {out['heads']}")
    if not 0 < out["holdout"] < 0.5:
        raise ValueError(f"workload.config.holdout: {out['holdout']} must be in (0, 0.5)")
    if not 0 <= out["min_lr"] <= 1:
        raise ValueError(f"workload.config.min_lr: {out['min_lr']} must be in [0, 1] (a fraction of lr)")
    for k in ("lr", "weight_decay", "grad_clip"):
        if out[k] < 0 or (k == "lr" and out[k] == 0):
            raise ValueError(f"workload.config.{k}: {out[k]} is out of range")
    return out


# ---- the model ---------------------------------------------------------------------------


class CausalSelfAttention(nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        # A buffer, not a parameter: not in the state dict (persistent=False), so packs hold
        # parameters only.
        mask = torch.ones(context, context, dtype=torch.bool).tril()
        self.register_buffer("mask", mask, persistent=False)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        hd = C // self.heads
        q = q.view(B, T, self.heads, hd).transpose(1, 2)
        k = k.view(B, T, self.heads, hd).transpose(1, 2)
        v = v.view(B, T, self.heads, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(~self.mask[:T, :T], float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))


class Block(nn.Module):
    def __init__(self, width, heads, context):
        super().__init__()
        self.ln1 = nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads, context)
        self.ln2 = nn.LayerNorm(width)
        self.fc = nn.Linear(width, 4 * width)
        self.out = nn.Linear(4 * width, width)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class Transformer(nn.Module):
    """GPT-style decoder. ``forward(idx)`` takes ``[B, T]`` int64 bytes, returns logits."""

    def __init__(self, layers, width, heads, context):
        super().__init__()
        self.context = context
        self.tok = nn.Embedding(VOCAB, width)
        self.pos = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads, context) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self._init(layers)

    def _init(self, layers):
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Embedding):
                nn.init.normal_(m.weight, std=0.02)
        # GPT-2: residual projections scaled down with depth.
        for b in self.blocks:
            nn.init.normal_(b.attn.proj.weight, std=0.02 / math.sqrt(2 * layers))
            nn.init.normal_(b.out.weight, std=0.02 / math.sqrt(2 * layers))

    def forward(self, idx):
        T = idx.shape[1]
        if T > self.context:
            raise ValueError(f"sequence of {T} tokens is longer than the model's context {self.context}")
        x = self.tok(idx) + self.pos(torch.arange(T, device=idx.device))
        for b in self.blocks:
            x = b(x)
        return F.linear(self.ln_f(x), self.tok.weight)  # head tied to the token embedding


def build_transformer(layers, width, heads, context):
    return Transformer(int(layers), int(width), int(heads), int(context))


def param_count(layers, width, heads, context):
    """Parameters of a model of this shape, without building it."""
    per_block = 4 * width + (3 * width * width + 3 * width) + (width * width + width) + 8 * width * width + 5 * width
    return VOCAB * width + context * width + layers * per_block + 2 * width


# ---- the inner optimizer -------------------------------------------------------------------


def lr_factor(step, warmup, decay_steps, min_lr):
    """Learning-rate multiplier at optimizer step ``step`` (1-based): linear warm-up to 1
    over ``warmup`` steps, then cosine from 1 to ``min_lr`` at ``decay_steps``, flat after."""
    if warmup > 0 and step <= warmup:
        return step / warmup
    if step >= decay_steps:
        return min_lr
    span = max(decay_steps - warmup, 1)
    t = (step - warmup) / span
    return min_lr + (1 - min_lr) * 0.5 * (1 + math.cos(math.pi * t))


class ScheduledAdamW(torch.optim.AdamW):
    """AdamW whose learning rate follows ``lr_factor`` of its own step count.

    The step count is read from the optimizer state (AdamW's per-parameter ``step``), which
    the worker saves and restores between rounds: round r's window continues the schedule
    where round r-1's stopped. Gradients are clipped to ``grad_clip`` (global norm) first.
    """

    def __init__(self, groups, lr, warmup, decay_steps, min_lr, grad_clip, **kw):
        super().__init__(groups, lr=lr, **kw)
        self.base_lr, self.warmup, self.decay_steps, self.min_lr = lr, warmup, decay_steps, min_lr
        self.grad_clip = grad_clip

    def steps_taken(self):
        for g in self.param_groups:
            for p in g["params"]:
                s = self.state.get(p, {}).get("step")
                if s is not None:
                    return int(s.item() if torch.is_tensor(s) else s)
        return 0

    @torch.no_grad()
    def step(self, closure=None):
        lr = self.base_lr * lr_factor(self.steps_taken() + 1, self.warmup, self.decay_steps, self.min_lr)
        for g in self.param_groups:
            g["lr"] = lr
        if self.grad_clip > 0:
            params = [p for g in self.param_groups for p in g["params"] if p.grad is not None]
            torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
        return super().step(closure)


# ---- the workload ----------------------------------------------------------------------------


class LM(Workload):
    def __init__(self, config):
        super().__init__(config)
        self.hp = resolve_config(self.config)
        for k, v in self.hp.items():
            setattr(self, k, v)
        # Each sample is context + 1 bytes: the model predicts the last context of them.
        self.tokens_per_sample = self.context
        self._cache = (None, None)
        self._heldout = None

    # The model ---------------------------------------------------------------------------

    def model_config(self):
        """The hyperparameters needed to rebuild the model (written as config.json)."""
        cfg = {"model_type": MODEL_TYPE, "vocab_size": VOCAB, "preset": self.preset}
        cfg.update({k: self.hp[k] for k in MODEL_KEYS})
        cfg["parameters"] = param_count(*(self.hp[k] for k in MODEL_KEYS))
        return cfg

    def build_model(self):
        return build_transformer(self.layers, self.width, self.heads, self.context)

    def blocks(self, model):
        """The transformer blocks: the units of activation checkpointing and of FSDP."""
        return list(model.blocks)

    def build_optimizer(self, model):
        decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
        groups = [{"params": decay, "weight_decay": self.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
        return ScheduledAdamW(groups, lr=self.lr, warmup=self.warmup, decay_steps=self.decay_steps,
                              min_lr=self.min_lr, grad_clip=self.grad_clip, betas=tuple(self.betas))

    # Data --------------------------------------------------------------------------------

    def split(self):
        """(train blocks, held-out bytes) of the corpus, deterministically."""
        text = corpus(self.corpus_bytes if self.corpus_bytes > 0 else 1 << 40)
        every = max(2, round(1 / self.holdout))
        blocks = [text[lo : lo + self.shard_bytes] for lo in range(0, len(text), self.shard_bytes)]
        train = [b for i, b in enumerate(blocks) if i % every != every - 1]
        held = b"".join(b for i, b in enumerate(blocks) if i % every == every - 1)
        need = self.context + 1
        if len(held) < need or sum(len(b) for b in train) < need:
            raise ValueError(
                f"workload.config.corpus_bytes: the corpus ({len(text)} bytes, {len(held)} held out) is shorter "
                f"than the context + 1 ({need} bytes) in its training or held-out part"
            )
        return train, held

    def _data(self, shard_paths):
        key = tuple(shard_paths)
        if self._cache[0] != key:
            parts = []
            for p in shard_paths:
                with open(p, "rb") as f:
                    parts.append(f.read())
            data = np.frombuffer(b"".join(parts), dtype=np.uint8)
            if len(data) < self.context + 2:
                raise ValueError(
                    f"{len(shard_paths)} shard file(s) hold {len(data)} bytes, fewer than workload.config.context + 2 "
                    f"({self.context + 2})"
                )
            self._cache = (key, torch.from_numpy(data.astype(np.int64)))
        return self._cache[1]

    def batches(self, shard_paths):
        """Random windows of context+1 bytes; one pass is about as many tokens as the shards hold."""
        data = self._data(shard_paths)
        n_batches = max(1, (len(data) - 1) // (self.context * self.batch_size))
        for _ in range(n_batches):
            yield self.window_batch(data)

    def window_batch(self, data, generator=None):
        """One batch: ``batch_size`` spans of context+1 bytes at random offsets in ``data``
        (an int64 tensor), as (inputs, next-byte targets)."""
        T = self.context
        off = torch.randint(0, len(data) - T, (self.batch_size,), generator=generator)
        w = data[off[:, None] + torch.arange(T + 1)]
        return w[:, :-1], w[:, 1:]

    def loss(self, model, batch):
        x, y = batch
        return F.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1))

    def evaluate(self, model):
        if self._heldout is None:
            _, held = self.split()
            held = np.frombuffer(held[: self.eval_bytes], dtype=np.uint8).astype(np.int64)
            T = self.context
            n = (len(held) - 1) // T
            if n < 1:
                raise ValueError(f"workload.config.eval_bytes: {len(held)} held-out bytes hold no window of context + 1 ({T + 1})")
            idx = np.arange(n)[:, None] * T + np.arange(T + 1)
            self._heldout = torch.from_numpy(held[idx])
        windows = self._heldout
        dev = self.device or "cpu"
        total, correct, count = 0.0, 0, 0
        step = max(1, 32768 // self.context)
        for lo in range(0, len(windows), step):
            w = windows[lo : lo + step].to(dev)
            logits = model(w[:, :-1]).reshape(-1, VOCAB)
            y = w[:, 1:].reshape(-1)
            total += float(F.cross_entropy(logits.float(), y, reduction="sum"))
            correct += int((logits.argmax(dim=1) == y).sum())
            count += y.numel()
        loss = total / max(count, 1)
        return {"loss": loss, "bits_per_byte": loss / math.log(2), "accuracy": correct / max(count, 1)}

    @classmethod
    def prepare_dataset(cls, config, out_dir):
        w = cls(config)
        train, _ = w.split()
        counts = {}
        for i, chunk in enumerate(train):
            name = shard_name(i, "txt")
            tmp = os.path.join(out_dir, f".{name}.tmp")
            with open(tmp, "wb") as f:
                f.write(chunk)
            os.replace(tmp, os.path.join(out_dir, name))
            counts[name] = max(1, len(chunk) // w.context)
        write_examples(out_dir, counts)
