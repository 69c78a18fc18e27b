"""p2ptrain — the Python side of p2pnode.

Users subclass ``Workload`` and name it in the experiment config
(``workload.factory: "my_pkg.mod:MyWorkload"``, ``workload.config: {...}``)::

    from p2ptrain import Workload

    class MyWorkload(Workload):
        def __init__(self, config: dict): ...                 # workload.config
        def build_model(self) -> "torch.nn.Module": ...        # built on the CPU
        def build_optimizer(self, model) -> "torch.optim.Optimizer": ...  # inner optimizer
        def batches(self, shard_paths: list[str]): ...         # iterator of batches
        def loss(self, model, batch) -> "torch.Tensor": ...     # scalar
        def evaluate(self, model) -> dict[str, float]: ...      # held-out metrics
        @classmethod
        def prepare_dataset(cls, config: dict, out_dir: str) -> None: ...  # optional
        # optional overrides: to_device(batch, device), count_samples(batch),
        # blocks(model) (the repeated blocks: activation checkpointing, FSDP)

The worker (``python -m p2ptrain.worker``, started by the node) owns device placement
(``self.device`` is set before ``build_model``), seeding, the inner optimizer's state
(saved as safetensors, never pickled) and the parameter packs (safetensors files of the
state dict's floating tensors chosen by include/exclude globs).

Modules:

- ``p2ptrain.workload``     the Workload base class and factory loading
- ``p2ptrain.safetensors``  safetensors read/write with numpy buffers; canonical packs; layout hash
- ``p2ptrain.packs``        model state dict <-> pack (globs, layout check)
- ``p2ptrain.optstate``     inner-optimizer state <-> safetensors
- ``p2ptrain.session``      a workload + model on a device; the protocol's methods
- ``p2ptrain.placement``    workload.devices / ranks / shard: where the ranks run, checked
- ``p2ptrain.ranks``        ranks inside one worker: starts, watches and restarts them
- ``p2ptrain.rank``         one rank: DDP (gloo/NCCL), its share of the batch stream
- ``p2ptrain.fsdp``         workload.shard fsdp: FSDP2 shards, whole-model packs from them
- ``p2ptrain.memory``       activation checkpointing per block; peak memory
- ``p2ptrain.worker``       the framed request loop (docs/worker-protocol.md)
- ``p2ptrain.command``      the ready-made checkpoint command
- ``p2ptrain.prepare``      ``prepare_dataset`` from the command line
- ``p2ptrain.modelconfig``  a workload's ``model_config()`` as JSON (config.json of exports)
- ``p2ptrain.sample``       generate text from an exported ``lm`` model directory
- ``p2ptrain.workloads``    reference workloads: digits, charlm, lm, bench
- ``p2ptrain.testing``      fault-injecting workloads used by the tests
"""

from .errors import BadRequest, LayoutMismatch, NonFinite, P2PTrainError, WorkloadError
from .workload import Workload

__all__ = ["Workload", "P2PTrainError", "BadRequest", "WorkloadError", "LayoutMismatch", "NonFinite"]
__version__ = "0.1.0"
