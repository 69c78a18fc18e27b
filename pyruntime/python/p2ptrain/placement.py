"""Where a worker's ranks run: ``workload.devices``, ``workload.ranks`` and ``workload.shard``.

- ``devices: [cuda:0, cuda:1, ...]`` or ``devices: all`` (every GPU torch sees): one rank per
  GPU, NCCL between them.
- ``ranks: N`` on a CPU (``device: cpu``, or ``auto`` on a machine without a GPU): N ranks,
  gloo between them.
- neither (or one device): no ranks, the model trains in the worker process as before.

``shard`` is ``ddp`` (the default: every rank holds the whole model, gradients are averaged
every step) or ``fsdp`` (FSDP2 ``fully_shard``: parameters, gradients and optimizer state are
split over the ranks; needs torch >= 2.4 and at least two ranks). Errors name the config
field, so that a node refuses the setting at start-up.
"""

import os

import torch

from .errors import BadRequest

SHARDS = ("ddp", "fsdp")
FSDP_MIN_TORCH = (2, 4)


def torch_version(v=None):
    """(major, minor) of a torch version string such as '2.11.0+cu130' or '1.13.0a0'."""
    parts = (v or torch.__version__).split("+")[0].split(".")
    out = []
    for p in parts[:2]:
        digits = "".join(c for c in p if c.isdigit()) or "0"
        out.append(int(digits))
    return tuple(out + [0] * (2 - len(out)))


def fully_shard_fn():
    """FSDP2's ``fully_shard`` (public in torch >= 2.6, under _composable in 2.4 and 2.5), or
    None when this torch has none."""
    if torch_version() < FSDP_MIN_TORCH:
        return None
    try:
        from torch.distributed.fsdp import fully_shard

        return fully_shard
    except ImportError:
        pass
    try:
        from torch.distributed._composable.fsdp import fully_shard

        return fully_shard
    except ImportError:
        return None


def plan(device=None, devices=None, ranks=0, shard=""):
    """The rank devices (a list of torch.device, one per rank), or None when the worker
    trains on ``device`` itself. A list of one (``devices: [cuda:1]``) is that device without
    ranks. Refuses what cannot run here, naming the field."""
    shard = shard or "ddp"
    if shard not in SHARDS:
        raise BadRequest(f"workload.shard {shard!r} is not one of {', '.join(SHARDS)}")
    if ranks is None:
        ranks = 0
    if isinstance(ranks, bool) or not isinstance(ranks, int) or ranks < 0:
        raise BadRequest(f"workload.ranks must be a whole number >= 0, got {ranks!r}")
    out = None
    if devices:
        if device not in (None, "", "auto"):
            raise BadRequest(f"workload.devices and workload.device ({device!r}) are both set: set one of them")
        if ranks > 1:
            raise BadRequest("workload.ranks and workload.devices are both set: ranks counts CPU processes, devices lists GPUs")
        out = _gpus(devices)
    elif ranks > 1:
        want = device if device not in (None, "") else "auto"
        if want == "auto":
            if torch.cuda.is_available():
                raise BadRequest(
                    f"workload.ranks {ranks}: ranks are CPU processes, and workload.device auto picks the GPU on this "
                    f"machine; set workload.device: cpu, or list the GPUs in workload.devices"
                )
        elif want != "cpu":
            raise BadRequest(
                f"workload.ranks {ranks} runs ranks on the CPU, and workload.device is {want!r}: list GPUs in "
                f"workload.devices instead"
            )
        out = [torch.device("cpu")] * ranks
    world = len(out) if out else 1
    if shard == "fsdp":
        if world < 2:
            raise BadRequest(
                "workload.shard fsdp needs at least two ranks (workload.devices or workload.ranks): with one device "
                "there is nothing to shard the model over"
            )
        if fully_shard_fn() is None:
            raise BadRequest(
                f"workload.shard fsdp needs torch >= {FSDP_MIN_TORCH[0]}.{FSDP_MIN_TORCH[1]} (FSDP2 fully_shard); this "
                f"worker's torch is {torch.__version__}: use shard ddp (the default) or a newer torch"
            )
    return out


def _gpus(devices):
    """Parse workload.devices: 'all' or a list of distinct cuda:N that this machine has."""
    if devices == "all" or devices == ["all"]:
        if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
            raise BadRequest(
                f"workload.devices all: torch sees no CUDA device on this machine (torch {torch.__version__}, "
                f"CUDA build {torch.version.cuda or 'none'}); use workload.ranks for CPU ranks"
            )
        return [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    if not isinstance(devices, (list, tuple)) or not all(isinstance(d, str) for d in devices):
        raise BadRequest(f"workload.devices must be 'all' or a list of device names such as cuda:0, got {devices!r}")
    parsed = []
    for i, d in enumerate(devices):
        try:
            dev = torch.device(d)
        except (RuntimeError, ValueError) as e:
            raise BadRequest(f"workload.devices[{i}] {d!r} is not a device torch knows: {e}") from None
        parsed.append(dev)
    types = {d.type for d in parsed}
    if "cpu" in types and len(types) > 1:
        raise BadRequest(f"workload.devices {list(devices)} mixes cpu and {', '.join(sorted(types - {'cpu'}))}: ranks run on one kind of device")
    if types == {"cpu"}:
        raise BadRequest("workload.devices lists cpu: set workload.device: cpu and workload.ranks: N for CPU ranks")
    if types != {"cuda"}:
        raise BadRequest(f"workload.devices {list(devices)}: ranks run on CUDA devices (cuda:N) or on CPUs (workload.ranks)")
    seen = {}
    for i, (name, dev) in enumerate(zip(devices, parsed)):
        if dev.index is None:
            raise BadRequest(f"workload.devices[{i}] {name!r}: name each GPU by its index (cuda:0, cuda:1, ...)")
        if dev.index in seen:
            raise BadRequest(f"workload.devices[{i}] {name!r} names the same GPU as workload.devices[{seen[dev.index]}]")
        seen[dev.index] = i
    if not torch.cuda.is_available():
        raise BadRequest(
            f"workload.devices {list(devices)}: torch.cuda.is_available() is false on this machine "
            f"(torch {torch.__version__}, CUDA build {torch.version.cuda or 'none'})"
        )
    n = torch.cuda.device_count()
    for i, dev in enumerate(parsed):
        if dev.index >= n:
            raise BadRequest(f"workload.devices[{i}] cuda:{dev.index} does not exist: this machine has {n} CUDA device(s), cuda:0..cuda:{n - 1}")
    return parsed


def nvidia_present():
    """Whether this machine shows an NVIDIA GPU: a /dev/nvidia* device node or nvidia-smi in PATH."""
    import glob
    import shutil

    return bool(glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi"))


def cuda_warning(device):
    """A warning when the worker is about to train on the CPU of a machine with an NVIDIA GPU
    that this torch cannot use (a CPU-only build such as Debian's, or a driver mismatch);
    None otherwise."""
    if str(device).startswith("cuda") or torch.cuda.is_available() or not nvidia_present():
        return None
    return (
        f"this machine has an NVIDIA GPU but torch {torch.__version__} (CUDA build {torch.version.cuda or 'none'}) "
        f"cannot use it, so the worker trains on {device}: install a CUDA build of torch (docs/gpu.md) and point "
        f"workload.interpreter at it; `p2pnode doctor` checks it"
    )
