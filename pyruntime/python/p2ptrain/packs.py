"""Model state dict <-> parameter pack.

The pack holds the floating-point tensors of ``model.state_dict()`` whose names match the
include globs (all when empty) and none of the exclude globs (fnmatch syntax, case
sensitive), in ascending byte order of their names. Everything else in the state dict
(integer buffers such as BatchNorm's ``num_batches_tracked``, excluded layers) stays as the
workload built it.
"""

from fnmatch import fnmatchcase

import torch

from . import safetensors
from .errors import BadRequest, LayoutMismatch, NonFinite


def check_globs(include, exclude):
    for label, globs in (("include", include), ("exclude", exclude)):
        if not isinstance(globs, (list, tuple)):
            raise BadRequest(f"{label} must be a list of glob strings, got {type(globs).__name__}")
        for g in globs:
            if not isinstance(g, str) or not g.strip() or "\0" in g:
                raise BadRequest(f"{label} glob {g!r} must be a non-empty string without NUL")


def selected(name, include, exclude):
    """Whether a state-dict name is chosen by the globs."""
    if include and not any(fnmatchcase(name, g) for g in include):
        return False
    return not any(fnmatchcase(name, g) for g in exclude)


class PackSpec:
    """Which tensors of a model form its pack, resolved once per model."""

    def __init__(self, model, include=(), exclude=()):
        check_globs(include, exclude)
        self.model = model
        self.include, self.exclude = list(include), list(exclude)
        self.refresh()

    def refresh(self):
        """Re-read the model's tensors (after their storage was replaced)."""
        sd = self.model.state_dict(keep_vars=False)
        chosen = []
        for name, t in sd.items():
            if torch.is_tensor(t) and t.is_floating_point() and selected(name, self.include, self.exclude):
                chosen.append((name, t))
        chosen.sort(key=lambda kv: kv[0].encode("utf-8"))
        # state_dict tensors are detached views sharing storage with the parameters and
        # buffers, so writing into them sets the model.
        self.tensors = chosen
        # Buffers (BatchNorm running statistics) are state, not weights: validators average
        # them instead of stepping them with the outer optimizer (momentum would push a
        # running variance below zero). The pack's metadata names them.
        buffer_names = {name for name, _ in self.model.named_buffers()}
        self.buffers = [name for name, _ in chosen if name in buffer_names]
        self.entries = [(name, tuple(t.shape)) for name, t in chosen]
        self.layout_hash = safetensors.layout_hash(self.entries)
        self.param_count = sum(t.numel() for _, t in chosen)

    @property
    def names(self):
        return [n for n, _ in self.tensors]


def _host_f32(t):
    t = t.detach()
    if t.device.type != "cpu" or t.dtype != torch.float32:
        t = t.to(device="cpu", dtype=torch.float32)
    if not t.is_contiguous():
        t = t.contiguous()
    return t.numpy()


def export_pack(spec, path, extra_metadata=None):
    """Write the spec's tensors as a canonical pack; returns its layout hash.

    CPU float32 contiguous tensors are written straight from their buffers; others are
    converted once (device->host, dtype) and written from the converted buffer.
    """
    meta = dict(extra_metadata or {})
    if spec.buffers:
        meta["buffers"] = ",".join(spec.buffers)
    return safetensors.write_pack(path, [(name, _host_f32(t)) for name, t in spec.tensors], meta)


def load_pack(spec, path):
    """Set the model's tensors from a pack; the pack's layout hash must equal the model's.

    On the CPU, float32 parameters and buffers are re-pointed at the pack's private
    (copy-on-write) mapping instead of being copied: loading costs page faults, and a page
    is only copied when training first writes to it. Other devices and dtypes copy.
    Packs are never modified in place by anyone (writers replace files by rename), so the
    mapping stays valid for as long as the model uses it.
    """
    with safetensors.Pack(path) as p:
        if p.layout_hash != spec.layout_hash:
            raise LayoutMismatch(
                f"pack {path} has layout {p.layout_hash}, the model expects {spec.layout_hash} "
                f"(pack: {len(p.tensors)} tensors / {p.param_count} values; "
                f"model: {len(spec.tensors)} tensors / {spec.param_count} values)"
            )
        remapped = False
        with torch.no_grad():
            for name, t in spec.tensors:
                src = torch.from_numpy(p.array(name))
                if t.device.type == "cpu" and t.dtype == torch.float32 and _repoint(spec.model, name, src):
                    remapped = True
                else:
                    t.copy_(src)
    if remapped:
        spec.refresh()
    return spec.layout_hash


def shift_pack(spec, to, frm, part=None):
    """Add pack ``to`` minus pack ``frm`` to the spec's tensors, in place: moves a model
    trained from ``frm`` onto ``to`` with the progress it made kept. Both packs must have the
    model's layout; the model is unchanged when either does not. ``part(delta, t)`` gives
    the tensor to add to and the piece of the whole delta it holds (a rank's shard, FSDP);
    by default ``t`` and all of it."""
    with safetensors.Pack(to) as a, safetensors.Pack(frm) as b:
        for p in (a, b):
            if p.layout_hash != spec.layout_hash:
                raise LayoutMismatch(f"pack {p.path} has layout {p.layout_hash}, the model expects {spec.layout_hash}")
        with torch.no_grad():
            for name, t in spec.tensors:
                d = torch.from_numpy(a.array(name)) - torch.from_numpy(b.array(name))
                if part is None:
                    t.add_(d.to(device=t.device, dtype=t.dtype))
                else:
                    dst, piece = part(d, t)
                    dst.add_(piece)


def _repoint(model, name, src):
    """Make the parameter or buffer called ``name`` use ``src``'s storage; False if it is
    neither (then the caller copies)."""
    mod_name, _, attr = name.rpartition(".")
    try:
        mod = model.get_submodule(mod_name) if mod_name else model
    except AttributeError:
        return False
    if attr in mod._parameters and mod._parameters[attr] is not None:
        mod._parameters[attr].data = src
        return True
    if attr in mod._buffers and mod._buffers[attr] is not None:
        mod._buffers[attr] = src
        return True
    return False


def check_finite(spec):
    """Raise NonFinite naming the first tensor that holds a NaN or Inf."""
    with torch.no_grad():
        for name, t in spec.tensors:
            if not bool(torch.isfinite(t).all()):
                bad = int((~torch.isfinite(t)).sum())
                raise NonFinite(f"parameter {name} holds {bad} non-finite value(s) after training")


def flat_host_views(spec):
    """``[(name, float32 numpy array)]`` of the spec's tensors on the host (views for CPU F32)."""
    return [(name, _host_f32(t)) for name, t in spec.tensors]


