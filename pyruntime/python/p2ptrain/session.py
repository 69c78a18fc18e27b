"""A workload with its model on a device: what the worker and the command backend run.

Every public method implements one protocol method (docs/worker-protocol.md) and returns
its JSON-able result. Exceptions raised inside user code become ``WorkloadError`` with the
user's traceback chained.
"""

import contextlib
import json
import math
import os
import random
import sys
import time

import numpy as np
import torch

from . import memory, optstate, packs
from . import workload as workload_mod
from .errors import BadRequest, NonFinite, P2PTrainError, WorkloadError


@contextlib.contextmanager
def user_code(what):
    """Turn exceptions escaping user code into WorkloadError (keeping the cause)."""
    try:
        yield
    except P2PTrainError:
        raise
    except Exception as e:
        raise WorkloadError(f"{what} raised {type(e).__name__}: {e}") from e


def seed_everything(seed):
    seed = int(seed)
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed % (1 << 32))


def pick_device(want):
    """The torch device for workload.device: "auto" (cuda when available), "cpu", "cuda",
    "cuda:N". Errors name the setting, so that a node reports them at start-up."""
    if want in (None, "", "auto"):
        return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(want)
    except (RuntimeError, ValueError) as e:
        raise BadRequest(f"workload.device {want!r} is not a device torch knows: {e}") from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise BadRequest(
                f"workload.device {want!r} requested but torch.cuda.is_available() is false on this machine "
                f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'}); use 'cpu' or 'auto'"
            )
        n = torch.cuda.device_count()
        if dev.index is not None and dev.index >= n:
            raise BadRequest(f"workload.device {want!r}: this machine has {n} CUDA device(s), cuda:0..cuda:{n - 1}")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
    elif dev.type != "cpu":
        # mps, xpu, ...: allowed when torch can allocate there.
        try:
            torch.empty(1, device=dev)
        except Exception as e:
            raise BadRequest(f"workload.device {want!r} is not usable: {type(e).__name__}: {e}") from None
    return dev


PRECISIONS = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}


def check_precision(precision, device):
    """The autocast dtype for workload.precision on device (None for fp32)."""
    precision = precision or "fp32"
    if precision not in PRECISIONS:
        raise BadRequest(f"workload.precision {precision!r} is not one of fp32, bf16, fp16")
    dtype = PRECISIONS[precision]
    if precision == "fp16" and device.type != "cuda":
        raise BadRequest(
            f"workload.precision 'fp16' needs a CUDA device, and the workload runs on {device} "
            f"(workload.device); use bf16 or fp32 on a CPU"
        )
    if precision == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise BadRequest(
            f"workload.precision 'bf16': {torch.cuda.get_device_name(device)} does not support bfloat16; use fp16"
        )
    return dtype


def device_info(device):
    """Name and memory of the device, for the node's /status."""
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        return {"device_name": p.name, "device_memory_bytes": int(p.total_memory)}
    if device.type == "cpu":
        name = ""
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        name = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        mem = 0
        try:
            mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            pass
        return {"device_name": name or "cpu", "device_memory_bytes": int(mem)}
    return {"device_name": str(device), "device_memory_bytes": 0}


def read_shift(path, remove):
    """The pack a shift request file ({"to": PACK}) names; the file is removed when asked."""
    try:
        with open(path, "rb") as f:
            req = json.load(f)
        to = req["to"]
        if not isinstance(to, str) or not to:
            raise ValueError(f'"to" is {to!r}')
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BadRequest(f"shift request {path}: {e}") from e
    if remove:
        os.remove(path)
    return to


class Session:
    """The workload's model on one device. A rank of a multi-device worker is a
    ``rank.RankSession``, which overrides the hooks marked below."""

    rank, world_size = 0, 1

    def __init__(self, factory, config=None, include=(), exclude=(), device="auto", threads=0, seed=0, precision="fp32",
                 activation_checkpointing=False):
        packs.check_globs(include, exclude)
        if threads and int(threads) > 0:
            torch.set_num_threads(int(threads))
        self.factory = factory
        self.config = dict(config or {})
        self.include, self.exclude = list(include), list(exclude)
        self.seed = int(seed)
        self.activation_checkpointing = bool(activation_checkpointing)
        self.workload = workload_mod.build(factory, self.config)
        if device in (None, "", "auto"):
            device = self.config.get("device", "auto")
        self.device = pick_device(device)
        self.precision = precision or "fp32"
        self.amp_dtype = check_precision(self.precision, self.device)
        self.workload.device = self.device
        self.workload.rank, self.workload.world_size = self.rank, self.world_size
        if self.activation_checkpointing and not callable(getattr(self.workload, "blocks", None)):
            raise BadRequest(
                f"workload.activation_checkpointing: workload {factory!r} has no blocks(model) method naming the "
                f"modules to checkpoint (see p2ptrain.Workload.blocks)"
            )
        self._build(self.seed)

    def _build(self, seed):
        self.model = self.spec = None
        seed_everything(seed)
        with user_code("build_model()"):
            model = self.workload.build_model()
        if not isinstance(model, torch.nn.Module):
            raise WorkloadError(f"build_model() returned {type(model).__name__}, not a torch.nn.Module")
        if self.activation_checkpointing:
            memory.checkpoint_blocks(self._blocks(model))
        model = self._place(model)
        model.train()
        self.model = model
        self.spec = packs.PackSpec(model, self.include, self.exclude)
        if self.spec.param_count == 0:
            raise BadRequest(
                f"the include/exclude globs ({self.include} / {self.exclude}) select no floating-point tensors of the model"
            )
        # What loss() is given: the model itself here, the DDP wrapper on a rank.
        self.loss_model = model

    def _blocks(self, model):
        """The workload's repeated blocks (activation checkpointing and FSDP work per block)."""
        fn = getattr(self.workload, "blocks", None)
        if not callable(fn):
            return []
        with user_code("blocks()"):
            blocks = list(fn(model))
        for b in blocks:
            if not isinstance(b, torch.nn.Module):
                raise WorkloadError(f"blocks() must return torch.nn.Module objects, got {type(b).__name__}")
        return blocks

    def _place(self, model):
        """Put a freshly built model on the device (a rank also wraps or shards it)."""
        return model.to(self.device)

    # ---- protocol methods -------------------------------------------------------------

    def info(self):
        return {
            "workload": self.factory if isinstance(self.factory, str) else type(self.workload).__name__,
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "device": str(self.device),
            "precision": self.precision,
            **device_info(self.device),
            "layout_hash": self.spec.layout_hash,
            "param_count": self.spec.param_count,
            "tokens_per_sample": int(getattr(self.workload, "tokens_per_sample", 0) or 0),
            "activation_checkpointing": self.activation_checkpointing,
        }

    def init(self, seed, out):
        self._build(seed)
        self._export(out)
        return {"layout_hash": self.spec.layout_hash, "param_count": self.spec.param_count}

    def load(self, pack):
        self._load(pack)
        return {"layout_hash": self.spec.layout_hash}

    def export(self, out):
        self._export(out)
        return {"layout_hash": self.spec.layout_hash}

    # ---- hooks a rank overrides ---------------------------------------------------------

    def _load(self, pack):
        packs.load_pack(self.spec, pack)

    def _export(self, out):
        packs.export_pack(self.spec, out)

    def _save_optimizer(self, opt, path):
        optstate.save(opt, path)

    def _load_optimizer(self, opt, path):
        optstate.load(opt, path)

    def _train_batches(self, shards, seed):
        """The window's batches as (batch, weight): every batch, weight 1 (drawn with the
        global RNG, which train seeded with seed). A rank keeps its share of the stream
        (weight 0 marks a rank left idle by a short lease)."""
        for b in self._batches(shards):
            yield b, 1.0

    def _shift_to(self, path, step, steps):
        """The pack a shift request at path asks to move onto before this step, or None."""
        if not os.path.exists(path):
            return None
        return read_shift(path, remove=True)

    def _shift(self, to, base):
        packs.shift_pack(self.spec, to, base)

    def progress(self, steps_done):
        """Called after every inner step (a rank tells its coordinator, which watches for a
        rank that stopped)."""

    def _losses(self, pending, weight):
        """The losses of the steps in pending (a rank: the mean over the ranks that trained)."""
        return torch.stack(pending).cpu().tolist()

    def _check_finite(self):
        packs.check_finite(self.spec)

    def _batches(self, shards, passes=None):
        """An endless batch iterator: calls batches() again when it runs out. Each finished
        pass's batch count is appended to passes (when given)."""
        while True:
            with user_code("batches()"):
                it = iter(self.workload.batches(list(shards)))
            got = 0
            while True:
                with user_code("batches()"):
                    try:
                        b = next(it)
                    except StopIteration:
                        break
                got += 1
                yield b
            if passes is not None:
                passes.append(got)
            if not got:
                raise WorkloadError(f"batches() yielded no batches from {len(shards)} shard file(s)")

    def _optimizer(self):
        with user_code("build_optimizer()"):
            opt = self.workload.build_optimizer(self.model)
        if not isinstance(opt, torch.optim.Optimizer):
            raise WorkloadError(f"build_optimizer() returned {type(opt).__name__}, not a torch.optim.Optimizer")
        return opt

    def _autocast(self):
        """Mixed precision for workload.precision bf16/fp16; nothing for fp32."""
        if self.amp_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def _scaler(self):
        """A GradScaler for fp16 (whose gradients underflow without one); None otherwise."""
        if self.amp_dtype is not torch.float16:
            return None
        if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):  # torch >= 2.3
            return torch.amp.GradScaler("cuda")
        return torch.cuda.amp.GradScaler()

    def _step(self, opt, batch):
        w = self.workload
        with user_code("to_device()"):
            batch = w.to_device(batch, self.device)
        opt.zero_grad(set_to_none=True)
        with user_code("loss()"), self._autocast():
            loss = w.loss(self.loss_model, batch)
        if not torch.is_tensor(loss) or loss.numel() != 1:
            raise WorkloadError(f"loss() must return a scalar tensor, got {type(loss).__name__}")
        return loss, batch

    @staticmethod
    def _update(opt, loss, scaler):
        with user_code("backward()/optimizer.step()"):
            if scaler is None:
                loss.backward()
                opt.step()
            else:
                scaler.scale(loss).backward()
                scaler.step(opt)  # skipped when the scaled gradients overflowed
                scaler.update()

    def train(self, base, shards, steps, seed, opt_in=None, opt_out=None, out=None, shift=None):
        """Run ``steps`` inner steps from ``base``. With ``shift`` (a path), before each step
        the worker looks for a file there; when one has appeared ({"to": PACK}) it moves the
        model onto PACK once, keeping the progress made so far (packs.shift_pack: += PACK −
        base), removes the file and reports the step in ``shifted_at`` and PACK in
        ``shifted_to``: a window trained ahead from a guess at a head moved onto the head when
        it comes (protocol.overlap: eager)."""
        if shift and not base:
            raise BadRequest("train: shift needs a base")
        if base:
            self._load(base)
        seed_everything(seed)
        opt = self._optimizer()
        if opt_in:
            self._load_optimizer(opt, opt_in)
        w = self.workload
        self.model.train()
        batches = self._train_batches(shards, seed)
        scaler = self._scaler()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        # On a GPU, look at the losses every 32 steps and at the end (not a device sync per
        # step); on a CPU at every step.
        every = 1 if self.device.type == "cpu" else 32
        losses, pending = [], []
        samples = 0
        t0 = time.perf_counter()
        shifted_to, shifted_at = None, -1
        for step in range(steps):
            if shift and shifted_to is None:
                to = self._shift_to(shift, step, steps)
                if to is not None:
                    self._shift(to, base)
                    shifted_to, shifted_at = to, step
            batch, weight = next(batches)
            loss, batch = self._step(opt, batch)
            pending.append(loss.detach().float().reshape(()))
            self._update(opt, loss if weight == 1 else loss * weight, scaler)
            if weight:
                with user_code("count_samples()"):
                    samples += int(w.count_samples(batch))
            if len(pending) == every or step == steps - 1:
                vals = self._losses(pending, weight)
                for i, v in enumerate(vals):
                    if not math.isfinite(v):
                        raise NonFinite(f"loss is {v} at step {len(losses) + i + 1} of {steps}")
                losses.extend(vals)
                pending = []
            self.progress(step + 1)
        seconds = time.perf_counter() - t0
        self._check_finite()
        if out:
            self._export(out)
        if opt_out:
            self._save_optimizer(opt, opt_out)
        metrics = {"samples_per_second": samples / seconds if seconds > 0 else 0.0}
        if self.device.type == "cuda":
            metrics["device_max_memory_allocated_bytes"] = float(torch.cuda.max_memory_allocated(self.device))
        if scaler is not None:
            metrics["grad_scale"] = float(scaler.get_scale())
        lr = opt.param_groups[0].get("lr") if opt.param_groups else None
        if isinstance(lr, (int, float)):
            metrics["lr"] = float(lr)
        return {
            "steps": steps,
            "samples": samples,
            "loss": sum(losses) / len(losses) if losses else 0.0,
            "loss_first": losses[0] if losses else 0.0,
            "loss_last": losses[-1] if losses else 0.0,
            "seconds": seconds,
            "shifted_to": shifted_to,
            "shifted_at": shifted_at,
            "metrics": metrics,
        }

    def evaluate(self, pack=None):
        if pack:
            self._load(pack)
        self.model.eval()
        try:
            with torch.no_grad(), user_code("evaluate()"), self._autocast():
                m = self.workload.evaluate(self.model)
        finally:
            self.model.train()
        return {"metrics": clean_metrics(m, "evaluate()")}

    def probe(self, shards=(), steps=5):
        out = {"device": str(self.device), "samples_per_second": 0.0, "seconds_per_step": 0.0, "param_count": self.spec.param_count}
        if not shards or steps <= 0:
            return out
        # A throw-away model so that probing never changes the loaded parameters.
        saved = self.model, self.spec, self.loss_model
        try:
            self._build(self.seed)
            seed_everything(self.seed)
            opt = self._optimizer()
            batches = self._train_batches(shards, self.seed)
            scaler = self._scaler()
            samples, seconds = 0, 0.0
            for i in range(steps + 1):
                t0 = time.perf_counter()
                batch, weight = next(batches)
                loss, batch = self._step(opt, batch)
                self._update(opt, loss if weight == 1 else loss * weight, scaler)
                if self.device.type == "cuda":
                    torch.cuda.synchronize()
                if i > 0:  # the first step warms up allocators and kernels
                    seconds += time.perf_counter() - t0
                    if weight:
                        samples += int(self.workload.count_samples(batch))
            out["samples_per_second"] = samples / seconds if seconds > 0 else 0.0
            out["seconds_per_step"] = seconds / steps
        finally:
            self.model, self.spec, self.loss_model = saved
        return out


def clean_metrics(m, what):
    """Validate ``{str: number}``; non-finite values are sent as "nan", "inf", "-inf"."""
    if m is None:
        return {}
    if not isinstance(m, dict):
        raise WorkloadError(f"{what} must return a dict of name -> float, got {type(m).__name__}")
    out = {}
    for k, v in m.items():
        if not isinstance(k, str):
            raise WorkloadError(f"{what}: metric name {k!r} is not a string")
        if torch.is_tensor(v):
            v = v.item()
        if isinstance(v, (np.generic,)):
            v = v.item()
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise WorkloadError(f"{what}: metric {k!r} is {type(v).__name__}, not a number")
        v = float(v)
        if math.isnan(v):
            out[k] = "nan"
        elif math.isinf(v):
            out[k] = "inf" if v > 0 else "-inf"
        else:
            out[k] = v
    return out
