"""Tiny and Faulty test workloads (see p2ptrain.testing)."""

import os
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

from ..workload import Workload


class Tiny(Workload):
    def __init__(self, config):
        super().__init__(config)
        g = torch.Generator().manual_seed(0)
        self.dim = int(self.config.get("dim", 8))
        self.batch_size = int(self.config.get("batch_size", 16))
        w = torch.randn(self.dim, 1, generator=g)
        self.x = torch.randn(256, self.dim, generator=g)
        self.y = self.x @ w
        self.xt = torch.randn(64, self.dim, generator=g)
        self.yt = self.xt @ w

    def build_model(self):
        return nn.Sequential(nn.Linear(self.dim, 16), nn.Tanh(), nn.Linear(16, 1))

    def build_optimizer(self, model):
        return torch.optim.AdamW(model.parameters(), lr=float(self.config.get("lr", 1e-2)))

    def batches(self, shard_paths):
        perm = torch.randperm(len(self.x))
        for lo in range(0, len(perm), self.batch_size):
            idx = perm[lo : lo + self.batch_size]
            yield self.x[idx], self.y[idx]

    def loss(self, model, batch):
        x, y = batch
        return F.mse_loss(model(x), y)

    def evaluate(self, model):
        dev = self.device or "cpu"
        return {"mse": float(F.mse_loss(model(self.xt.to(dev)), self.yt.to(dev)))}


class Recorder(Tiny):
    """Tiny whose batches carry their sample indices; every batch trained is appended to
    ``record_dir``/rank<R>.txt as one line of indices (which batches which rank trained)."""

    def batches(self, shard_paths):
        perm = torch.randperm(len(self.x))
        for lo in range(0, len(perm), self.batch_size):
            idx = perm[lo : lo + self.batch_size]
            yield self.x[idx], self.y[idx], idx

    def loss(self, model, batch):
        x, y, idx = batch
        with open(os.path.join(self.config["record_dir"], f"rank{self.rank}.txt"), "a") as f:
            f.write(" ".join(str(int(i)) for i in idx) + "\n")
        return F.mse_loss(model(x), y)


class Faulty(Tiny):
    def __init__(self, config):
        super().__init__(config)
        c = self.config
        self.fault = c.get("fault", "nan")
        self.where = c.get("where", "train")
        self.at_step = int(c.get("at_step", 1))
        self.once_file = c.get("once_file")
        self.arm_file = c.get("arm_file")
        self.steps = 0
        if self.where == "construct" and self._armed():
            self._fire()

    def _armed(self):
        if self.arm_file and not os.path.exists(self.arm_file):
            return False
        if "rank" in self.config and self.rank != int(self.config["rank"]):
            return False
        if not self.once_file:
            return True
        if os.path.exists(self.once_file):
            return False
        with open(self.once_file, "w") as f:
            f.write("fired\n")
        return True

    def _fire(self):
        if self.fault == "exit":
            sys.stderr.write("Faulty: exiting on purpose\n")
            sys.stderr.flush()
            os._exit(int(self.config.get("exit_code", 3)))
        if self.fault == "hang":
            sys.stderr.write("Faulty: hanging on purpose\n")
            sys.stderr.flush()
            time.sleep(float(self.config.get("hang_seconds", 3600)))
        if self.fault == "raise":
            raise RuntimeError("Faulty: raising on purpose")
        if self.fault == "write":
            path = self.config["write_path"]
            with open(path + ".tmp", "w") as f:
                f.write(self.config.get("write_text", ""))
            os.replace(path + ".tmp", path)
        if self.fault == "print":
            print("Faulty: a line on stdout {\"id\": 1}", flush=True)
            print("Faulty: a line on stderr", file=sys.stderr, flush=True)

    def loss(self, model, batch):
        loss = super().loss(model, batch)
        self.steps += 1
        if self.where == "train" and self.steps == self.at_step and self._armed():
            if self.fault == "nan":
                return loss * float("nan")
            self._fire()
        return loss

    def evaluate(self, model):
        if self.where == "evaluate" and self._armed():
            if self.fault == "nan":
                return {"mse": float("nan")}
            self._fire()
        return super().evaluate(model)
