"""The ``Workload`` class users subclass, and loading one from ``module:attr``."""

import importlib

from .errors import BadRequest, WorkloadError


class Workload:
    """What the node needs to know about a model and its data.

    Subclass it and name it in the config (``workload.factory: "my_pkg.mod:MyWorkload"``)::

        class MyWorkload(Workload):
            def __init__(self, config): ...              # workload.config from the YAML
            def build_model(self): ...                   # -> torch.nn.Module (on the CPU)
            def build_optimizer(self, model): ...        # -> the inner torch.optim.Optimizer
            def batches(self, shard_paths): ...          # -> iterator of batches
            def loss(self, model, batch): ...            # -> scalar loss Tensor
            def evaluate(self, model): ...               # -> {"accuracy": 0.97, ...} (held out)
            @classmethod
            def prepare_dataset(cls, config, out_dir): ...   # optional: write shard files

    The worker owns the rest: it picks the device (``self.device`` is set before
    ``build_model`` is called; CUDA when available unless the node's config says otherwise),
    moves the model there and every batch through ``to_device``, seeds torch (and numpy and
    ``random``) before building a model and before every training run, keeps the inner
    optimizer's state between rounds as a safetensors file, and turns the state dict into
    parameter packs. ``evaluate`` runs under ``torch.no_grad()`` with ``model.eval()``.

    ``batches`` may be a generator; when it is exhausted before the requested number of
    steps, the worker calls it again (so one pass over the shards is enough). Shuffle with
    torch's global RNG (``torch.randperm``) to stay deterministic for a given seed.

    With several ranks (``workload.devices`` / ``workload.ranks``) every rank builds the
    workload; ``self.rank`` and ``self.world_size`` say which it is. Every rank reads the same
    batch stream and trains its share of it (so ``batches`` must not depend on the rank),
    ``loss`` gets the model wrapped by DDP under ``shard: ddp`` (``model.module`` is yours), and
    every parameter must take part in the loss. An optional ``blocks(model)`` returns the
    model's repeated blocks (a transformer's layers): the worker checkpoints their
    activations (``workload.activation_checkpointing``) and shards them one by one
    (``workload.shard: fsdp``).

    A model of tokens sets ``tokens_per_sample`` (a language model: its context): the
    dashboard then shows tokens per second beside samples per second.
    """

    tokens_per_sample = 0

    def __init__(self, config):
        self.config = dict(config or {})
        self.device = None  # a torch.device, set by the worker
        self.rank, self.world_size = 0, 1  # set by the worker

    def build_model(self):
        raise NotImplementedError(f"{type(self).__name__}.build_model")

    def build_optimizer(self, model):
        raise NotImplementedError(f"{type(self).__name__}.build_optimizer")

    def batches(self, shard_paths):
        raise NotImplementedError(f"{type(self).__name__}.batches")

    def loss(self, model, batch):
        raise NotImplementedError(f"{type(self).__name__}.loss")

    def evaluate(self, model):
        return {}

    @classmethod
    def prepare_dataset(cls, config, out_dir):
        raise NotImplementedError(f"{cls.__name__} does not prepare a dataset (no prepare_dataset)")

    # Overridable helpers -------------------------------------------------------------------

    def to_device(self, batch, device):
        """Move a batch to ``device``: tensors, numpy arrays, and lists/tuples/dicts of them."""
        return move_to_device(batch, device)

    def count_samples(self, batch):
        """Number of examples in a batch (for sample counts and contribution weights)."""
        return count_samples(batch)


def move_to_device(batch, device):
    import numpy as np
    import torch

    if torch.is_tensor(batch):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, np.ndarray):
        return torch.from_numpy(batch).to(device)
    if isinstance(batch, dict):
        return {k: move_to_device(v, device) for k, v in batch.items()}
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):
        return type(batch)(*(move_to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(move_to_device(v, device) for v in batch)
    return batch


def count_samples(batch):
    import torch

    if torch.is_tensor(batch) or hasattr(batch, "shape"):
        return int(batch.shape[0]) if len(batch.shape) else 1
    if isinstance(batch, dict) and batch:
        return count_samples(next(iter(batch.values())))
    if isinstance(batch, (list, tuple)) and batch:
        return count_samples(batch[0])
    return 1


def resolve(factory):
    """Import ``module:attr`` and return the attribute (a Workload class or a callable)."""
    if not isinstance(factory, str) or factory.count(":") != 1:
        raise BadRequest(f"factory {factory!r} must have the form 'module:attr'")
    mod_name, attr = factory.split(":")
    if not mod_name.strip() or not attr.strip():
        raise BadRequest(f"factory {factory!r} must name a module and an attribute")
    try:
        mod = importlib.import_module(mod_name)
    except Exception as e:
        raise WorkloadError(f"cannot import workload module {mod_name!r} (factory {factory!r}): {type(e).__name__}: {e}") from e
    obj = mod
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise WorkloadError(f"workload module {mod_name!r} has no attribute {attr!r} (factory {factory!r})") from None
    if not callable(obj):
        raise WorkloadError(f"factory {factory!r} is not callable")
    return obj


def build(factory, config):
    """Resolve the factory and construct the workload with ``config``."""
    ctor = resolve(factory)
    try:
        w = ctor(dict(config or {}))
    except Exception as e:
        raise WorkloadError(f"constructing workload {factory!r} failed: {type(e).__name__}: {e}") from e
    for method in ("build_model", "build_optimizer", "batches", "loss"):
        if not callable(getattr(w, method, None)):
            raise WorkloadError(f"workload {factory!r} has no {method}() method")
    if not hasattr(w, "to_device"):
        w.to_device = move_to_device
    if not hasattr(w, "count_samples"):
        w.count_samples = count_samples
    if not hasattr(w, "evaluate"):
        w.evaluate = lambda model: {}
    return w
