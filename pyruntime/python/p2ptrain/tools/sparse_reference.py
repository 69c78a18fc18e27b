"""The sparse codec of ``diloco/sparse.go`` in PyTorch, for the plain-PyTorch references.

Per block of ``block`` values (the pack's floating tensors concatenated in ascending order of
their names, as the node lays them out) keep the ``k`` of largest magnitude (``min(k, L)``
in a last, shorter block), quantize their magnitudes to the two levels that split them
(sorted) with the least squared error, keep their signs; everything else is zero. With
error feedback a worker encodes ``x = delta + decay · residual`` and keeps
``residual = x − decode(x)`` (SparseLoCo's decayed error feedback, the node's
``protocol.sparse_feedback_decay``). Under a top-k warm-up (``warmup_topk``, the node's
``protocol.sparse_warmup_rounds`` and ``sparse_warmup_factor``) the first rounds keep more
values per block, as the node's trainers do.

The learning it gives is the node's; the bits are not: sums here are float64 over torch's
order, ties in the top-k fall where ``torch.topk`` puts them, and no wire bytes are made.
"""

import math

import torch


def encode_decode(x, block=4096, k=64):
    """What the sparse codec's receiver decodes for the flat float32 tensor ``x``."""
    if block < 1 or k < 1:
        raise ValueError(f"sparse codec: block {block} and k {k} must be >= 1")
    n = x.numel()
    full = n // block * block
    out = torch.zeros_like(x)
    if full:
        out[:full] = _blocks(x[:full].view(-1, block), min(k, block)).view(-1)
    if full < n:
        out[full:] = _blocks(x[full:].view(1, -1), min(k, n - full)).view(-1)
    return out


def _blocks(xb, k):
    """Rows of ``xb`` each reduced to their top ``k`` at two magnitudes."""
    mags, idx = xb.abs().topk(k, dim=1)  # descending
    m = mags.double()
    cs, cs2 = m.cumsum(1), (m * m).cumsum(1)
    tot, tot2 = cs[:, -1:], cs2[:, -1:]
    s = torch.arange(1, k + 1, dtype=torch.float64)
    rest = torch.where(s < k, (tot - cs) ** 2 / (k - s).clamp(min=1), torch.zeros((), dtype=torch.float64))
    err = tot2 - cs ** 2 / s - rest  # squared error of splitting after the s largest
    split = err.argmin(1, keepdim=True) + 1  # the lowest s on ties
    hi_sum = cs.gather(1, split - 1)
    s_hi = (hi_sum / split).float()
    s_lo = torch.where(split < k, (tot - hi_sum) / (k - split).clamp(min=1), torch.zeros_like(hi_sum)).float()
    level = torch.where(torch.arange(k).unsqueeze(0) < split, s_hi, s_lo)
    sign = torch.where(xb.gather(1, idx) < 0, -1.0, 1.0)
    out = torch.zeros_like(xb)
    out.scatter_(1, idx, level * sign)
    return out


def warmup_topk(k, block, warmup, factor, round):
    """``diloco.SparseWarmupTopK``: the values per block a window of ``round`` (1 = the
    first) keeps under a top-k warm-up: ``k × factor`` in round 1, falling geometrically to
    ``k`` by round ``warmup + 1``, never more than ``block``; ``k`` from then on, and with
    ``warmup`` 0 or ``factor`` ≤ 1."""
    if warmup <= 0 or factor <= 1 or round <= 0 or round > warmup:
        return k
    kk = math.floor(k * factor ** ((warmup + 1 - round) / warmup) + 0.5)  # Go's math.Round
    return int(min(max(kk, k), max(block, k)))


class ErrorFeedback:
    """One worker's sparse encoder and residual."""

    def __init__(self, block=4096, k=64, decay=0.95, warmup=0, factor=1.0):
        if block < 1 or k < 1:
            raise ValueError(f"sparse codec: block {block} and k {k} must be >= 1")
        if not 0 < decay <= 1:
            raise ValueError(f"sparse codec: feedback decay {decay} not in (0, 1]")
        if warmup < 0 or not factor >= 1:
            raise ValueError(f"sparse codec: warm-up of {warmup} rounds and factor {factor}: want >= 0 and >= 1")
        self.block, self.k, self.decay, self.warmup, self.factor = block, k, decay, warmup, factor
        self.residual = None

    def send(self, global_model, model, round=0):
        """Encode ``global − local`` (with the warm-up's top-k for ``round``; 0: no warm-up)
        and set ``model``'s parameters to ``global − decoded``, so that the outer step sees
        what a validator decodes. Returns the decoded update."""
        names = sorted(n for n, _ in model.named_parameters())
        gp, lp = dict(global_model.named_parameters()), dict(model.named_parameters())
        with torch.no_grad():
            delta = torch.cat([(gp[n] - lp[n]).reshape(-1).float() for n in names])
            x = delta if self.residual is None else delta + self.decay * self.residual
            dec = encode_decode(x, self.block, warmup_topk(self.k, self.block, self.warmup, self.factor, round))
            self.residual = x - dec
            at = 0
            for n in names:
                p = lp[n]
                p.copy_(gp[n] - dec[at : at + p.numel()].view_as(p).to(p.dtype))
                at += p.numel()
        return dec
