"""Inner-optimizer state as a safetensors file — never a pickle.

``optimizer.state_dict()`` is ``{"state": {index: {key: tensor | scalar}}, "param_groups":
[...]}``. Tensors become safetensors entries named ``state.<index>.<key>`` in their own dtype;
``__metadata__`` holds

- ``format``: ``p2ptrain-optim/1``
- ``optimizer``: the optimizer's class name
- ``param_groups``: JSON of the param groups (hyper-parameters and parameter indices)
- ``scalars``: JSON ``{"<index>": {key: value}}`` of the non-tensor per-parameter state
- ``param_shapes``: JSON list of the shapes of the optimizer's parameters, in index order,
  checked on load so that state saved for another model is refused clearly.
"""

import json

import numpy as np
import torch

from . import safetensors
from .errors import BadRequest, LayoutMismatch, SafetensorsError

FORMAT = "p2ptrain-optim/1"

_TORCH_TO_NAME = {
    torch.float64: "F64",
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
_NAME_TO_TORCH = {v: k for k, v in _TORCH_TO_NAME.items()}


def _param_shapes(optimizer):
    return [list(p.shape) for g in optimizer.param_groups for p in g["params"]]


def _json_default(v):
    if isinstance(v, tuple):
        return list(v)
    if isinstance(v, (np.floating, np.integer)):
        return v.item()
    raise TypeError(f"value {v!r} of type {type(v).__name__} is not JSON-serialisable")


def _dumps(obj, what):
    try:
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=_json_default)
    except (TypeError, ValueError) as e:
        raise BadRequest(f"optimizer {what} cannot be stored as JSON: {e}") from None


def save(optimizer, path, whole=None, write=True):
    """Write ``optimizer.state_dict()`` to ``path``.

    ``whole`` gives a state tensor whole (FSDP: gathers its shards, a collective that every
    rank runs in the same order); each tensor is gathered when its turn to be written comes.
    With ``write`` false the tensors are gathered in that order and dropped: what the ranks
    that do not write the file do.
    """
    sd = optimizer.state_dict()
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for key, v in st.items():
            if torch.is_tensor(v):
                if v.dtype not in _TORCH_TO_NAME:
                    raise BadRequest(f"optimizer state {idx}.{key} has unsupported dtype {v.dtype}")
                name = _TORCH_TO_NAME[v.dtype]
                tensors[f"state.{idx}.{key}"] = (name, tuple(v.shape), _on_host(v, name, whole))
            else:
                scalars.setdefault(str(idx), {})[key] = v
    if not write:
        safetensors.produce_in_order(tensors)
        return
    meta = {
        "format": FORMAT,
        "optimizer": type(optimizer).__name__,
        "param_groups": _dumps(sd["param_groups"], "param_groups"),
        "scalars": _dumps(scalars, "scalar state"),
        "param_shapes": _dumps(_param_shapes(optimizer), "param shapes"),
    }
    safetensors.write(path, tensors, meta)


def _on_host(v, dtype_name, whole):
    def produce():
        t = (whole(v) if whole else v).detach().to("cpu").contiguous()
        if dtype_name == "BF16":
            return t.view(torch.int16).numpy().view(np.uint16)
        return t.numpy()

    return produce


def load(optimizer, path, place=None):
    """Load state written by ``save`` into ``optimizer`` (built for the same parameters).
    ``place(param, tensor)`` puts each whole state tensor where its parameter lives (FSDP:
    this rank's shard of it) as it is read, so the whole state is never on the host at once."""
    with safetensors.File(path) as f:
        meta = f.metadata
        if meta.get("format") != FORMAT:
            raise SafetensorsError(f"{path}: not an optimizer state file (format {meta.get('format')!r}, want {FORMAT!r})")
        want_cls = type(optimizer).__name__
        if meta.get("optimizer") not in (None, want_cls):
            raise LayoutMismatch(f"{path}: optimizer state is for {meta.get('optimizer')}, the workload builds {want_cls}")
        try:
            groups = json.loads(meta["param_groups"])
            scalars = json.loads(meta.get("scalars", "{}"))
            shapes = json.loads(meta.get("param_shapes", "null"))
        except (KeyError, ValueError) as e:
            raise SafetensorsError(f"{path}: bad optimizer metadata: {e}") from None
        have = _param_shapes(optimizer)
        if shapes is not None and shapes != have:
            raise LayoutMismatch(
                f"{path}: optimizer state was saved for {len(shapes)} parameters with other shapes "
                f"than the {len(have)} parameters of this model"
            )
        params = [p for g in optimizer.param_groups for p in g["params"]]
        state = {}
        for name in f.names():
            parts = name.split(".", 2)
            if len(parts) != 3 or parts[0] != "state" or not parts[1].isdigit():
                raise SafetensorsError(f"{path}: unexpected tensor {name!r} in optimizer state")
            info = f.info(name)
            arr = f.array(name)
            # Copy out of the mapping: the state lives on across calls and must not pin the file.
            if info.dtype == "BF16":
                t = torch.from_numpy(np.array(arr, copy=True).view(np.int16)).view(torch.bfloat16)
            else:
                t = torch.from_numpy(np.array(arr, copy=True))
            idx = int(parts[1])
            if place is not None and idx < len(params):
                t = place(params[idx], t)
            state.setdefault(idx, {})[parts[2]] = t
    for idx, kv in scalars.items():
        state.setdefault(int(idx), {}).update(kv)
    optimizer.load_state_dict({"state": state, "param_groups": groups})
