"""A model of configurable size, for the pack round-trip benchmark.

Factory ``p2ptrain.workloads.bench:Bench``. Config keys (defaults): ``params`` (1_000_000):
exact number of float32 parameters; ``width`` (1024): size of the square linear layers;
``batch_size`` (8); ``lr`` (1e-4). The model is ``params // (width*width + width)`` linear
layers with tanh, plus a ``tail`` vector holding the remaining parameters (so the count is
exact). Training fits ``sin(x)`` on synthetic data (shard contents are ignored); it is real
but only there so that every protocol method works on this model.
"""

import torch
import torch.nn.functional as F
from torch import nn

from ..workload import Workload


class BenchNet(nn.Module):
    def __init__(self, params, width):
        super().__init__()
        per = width * width + width
        k = params // per
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(k))
        rest = params - k * per
        self.tail = nn.Parameter(torch.zeros(rest)) if rest else None
        self.width = width

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


class Bench(Workload):
    def __init__(self, config):
        super().__init__(config)
        c = self.config
        self.params = int(c.get("params", 1_000_000))
        self.width = int(c.get("width", 1024))
        self.batch_size = int(c.get("batch_size", 8))
        self.lr = float(c.get("lr", 1e-4))
        if self.params <= 0 or self.width <= 0:
            raise ValueError(f"bad bench config {c}")

    def build_model(self):
        return BenchNet(self.params, self.width)

    def build_optimizer(self, model):
        return torch.optim.AdamW(model.parameters(), lr=self.lr)

    def batches(self, shard_paths):
        for _ in range(8):
            x = torch.randn(self.batch_size, self.width)
            yield x, torch.sin(x)

    def loss(self, model, batch):
        x, y = batch
        loss = F.mse_loss(model(x), y) if len(model.layers) else x.new_zeros(())
        if model.tail is not None:
            loss = loss + 1e-3 * (model.tail**2).mean()
        return loss

    def evaluate(self, model):
        g = torch.Generator().manual_seed(1234)
        x = torch.randn(64, self.width, generator=g).to(self.device or "cpu")
        return {"loss": float(self.loss(model, (x, torch.sin(x))))}
