"""``workload.shard: fsdp``: the model sharded over the ranks with FSDP2 (``fully_shard``).

Each of the workload's ``blocks(model)`` is sharded on its own, then the root (the
embeddings and whatever is outside the blocks): a block's parameters are gathered for its
forward and backward and freed after, so a rank holds its shard of everything plus one
block whole. FSDP2 splits every parameter on dim 0 with ``torch.chunk`` over the ranks, and
the optimizer state lives with the shards.

Packs and optimizer-state files stay whole-model files, the same bytes a one-device worker
writes:

- loading: every rank maps the pack and copies only its own chunk of each tensor (no
  collective, and only that chunk's pages are read);
- writing: the ranks gather one tensor at a time (``DTensor.full_tensor``) and rank 0 writes
  it at its place in the file before the next is gathered, so the whole model is never in
  host memory, let alone twice.

Needs torch >= 2.4 (``placement.fully_shard_fn``); the worker refuses ``shard: fsdp`` on an
older torch at hello, so nothing here is imported there.
"""

import torch

from . import packs, placement, safetensors
from .errors import LayoutMismatch

try:  # torch >= 2.5
    from torch.distributed.tensor import DTensor
except ImportError:  # torch 2.4
    from torch.distributed._tensor import DTensor


def mesh(device_type, world):
    """A one-dimensional device mesh over the world's ranks."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device_type, (world,))


def shard(model, blocks, device_mesh):
    """Shard each block, then the root; FSDP2 moves the shards to the mesh's device."""
    fully_shard = placement.fully_shard_fn()
    for b in blocks:
        fully_shard(b, mesh=device_mesh)
    fully_shard(model, mesh=device_mesh)
    return model


def is_sharded(t):
    return isinstance(t, DTensor)


def local(t):
    """The part of a (possibly sharded) tensor this rank holds."""
    return t.to_local() if isinstance(t, DTensor) else t


def local_chunk(full, like):
    """This rank's chunk of ``full`` (a whole tensor, any device) for the sharded tensor
    ``like``, on ``like``'s device and dtype: ``torch.chunk`` on dim 0 as FSDP2 splits, an
    empty slice for a rank past the last chunk."""
    if not isinstance(like, DTensor):
        return full.to(device=like.device, dtype=like.dtype)
    mine = like.to_local()
    dim0 = full.shape[0] if full.dim() else 1
    world = like.device_mesh.size()
    rank = like.device_mesh.get_local_rank()
    chunks = torch.chunk(full, world, dim=0) if full.dim() else (full,)
    part = chunks[rank] if rank < len(chunks) else full[dim0:dim0]
    if tuple(part.shape) != tuple(mine.shape):
        raise LayoutMismatch(
            f"rank {rank}: a chunk of shape {tuple(part.shape)} does not fit the shard of shape {tuple(mine.shape)} "
            f"(a tensor of shape {tuple(full.shape)} over {world} ranks)"
        )
    return part.to(device=mine.device, dtype=mine.dtype)


def as_sharded(full, param):
    """``full`` (a whole optimizer-state tensor) as a DTensor placed like ``param``."""
    if not isinstance(param, DTensor) or tuple(full.shape) != tuple(param.shape):
        return full
    part = local_chunk(full, param)
    return DTensor.from_local(part, param.device_mesh, param.placements, shape=param.shape, stride=param.stride())


def load_pack(spec, path):
    """Set the sharded model from a whole-model pack: each rank copies its chunks."""
    with safetensors.Pack(path) as p:
        if p.layout_hash != spec.layout_hash:
            raise LayoutMismatch(f"pack {path} has layout {p.layout_hash}, the model expects {spec.layout_hash}")
        with torch.no_grad():
            for name, t in spec.tensors:
                local(t).copy_(local_chunk(torch.from_numpy(p.array(name)), t))
    return spec.layout_hash


def shift_pack(spec, to, frm):
    """packs.shift_pack on the shards: each rank adds its chunk of ``to`` − ``frm``."""
    packs.shift_pack(spec, to, frm, part=lambda d, t: (local(t), local_chunk(d, t)))


def whole_host_f32(t):
    """A tensor gathered whole (a collective for a DTensor: every rank calls it in the same
    order) as a float32 numpy array on the host."""
    return whole(t).detach().to(device="cpu", dtype=torch.float32).contiguous().numpy()


def export_pack(spec, path, writer):
    """Write the sharded model as a whole-model pack; rank ``writer`` writes, the others
    gather with it one tensor at a time."""
    arrays = [(name, (tuple(t.shape), _gather(t))) for name, t in spec.tensors]
    meta = {"buffers": ",".join(spec.buffers)} if spec.buffers else None
    if writer:
        return safetensors.write_pack(path, arrays, meta)
    for _, (_, produce) in sorted(arrays, key=lambda kv: safetensors.name_key(kv[0])):
        produce()
    return spec.layout_hash


def _gather(t):
    return lambda: whole_host_f32(t)


def whole(v):
    """A tensor gathered whole (a collective for a DTensor), on its device."""
    return v.full_tensor() if isinstance(v, DTensor) else v
