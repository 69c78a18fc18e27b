#!/usr/bin/env python3
"""An independent reader for model directories written by `p2pnode export`.

It parses safetensors with nothing but json, struct and numpy (not the p2ptrain package,
not the Go code), loads the model directory (model.safetensors, or the shards named by
model.safetensors.index.json) and compares every tensor bit for bit with a reference
safetensors file: the parameter pack the model came from.

    export_reader.py MODEL_DIR PACK_FILE [EXPECTED_METADATA_JSON]

Exit status: 0 all equal, 1 a difference (printed), 3 numpy is missing (skipped).
Run by the Go test export.TestIndependentReader.
"""

import json
import os
import struct
import sys

try:
    import numpy as np
except ImportError:  # pragma: no cover - depends on the machine
    print("SKIP: numpy is not installed (Debian: apt-get install python3-numpy)")
    sys.exit(3)

# safetensors dtype -> numpy dtype, little-endian as the format requires.
DTYPES = {
    "F64": "<f8", "F32": "<f4", "F16": "<f2",
    "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1", "U8": "u1", "BOOL": "?",
}

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"


class Mismatch(Exception):
    pass


def read_safetensors(path):
    """Returns ({name: ndarray}, metadata) for one safetensors file."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise Mismatch(f"{path}: {len(data)} bytes is too short")
    (n,) = struct.unpack("<Q", data[:8])
    if 8 + n > len(data):
        raise Mismatch(f"{path}: header length {n} exceeds the file")
    header = json.loads(data[8:8 + n].decode("utf-8"))
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        dtype = np.dtype(DTYPES[info["dtype"]])
        shape = tuple(info["shape"])
        count = int(np.prod(shape, dtype=np.int64)) if shape else 1
        if end - begin != count * dtype.itemsize or base + end > len(data):
            raise Mismatch(f"{path}: tensor {name}: offsets [{begin}, {end}] do not fit {info}")
        arr = np.frombuffer(data, dtype=dtype, count=count, offset=base + begin)
        tensors[name] = arr.reshape(shape)
    return tensors, meta


def load_model(model_dir):
    """Returns ({name: ndarray}, {file: metadata}) for a model directory."""
    index_path = os.path.join(model_dir, INDEX)
    if os.path.exists(index_path):
        with open(index_path) as f:
            index = json.load(f)
        weight_map = index["weight_map"]
        files = sorted(set(weight_map.values()))
    else:
        weight_map = None
        files = [SINGLE]
    tensors, metas = {}, {}
    for name in files:
        t, meta = read_safetensors(os.path.join(model_dir, name))
        metas[name] = meta
        for k, v in t.items():
            if weight_map is not None and weight_map.get(k) != name:
                raise Mismatch(f"{name} holds {k}, which the index puts in {weight_map.get(k)}")
            if k in tensors:
                raise Mismatch(f"tensor {k} appears twice")
            tensors[k] = v
    if weight_map is not None:
        missing = set(weight_map) - set(tensors)
        if missing:
            raise Mismatch(f"index names tensors no file holds: {sorted(missing)}")
        total = sum(v.nbytes for v in tensors.values())
        if index.get("metadata", {}).get("total_size") != total:
            raise Mismatch(f"index total_size {index.get('metadata')} != {total}")
    return tensors, metas


def compare(model, ref):
    if set(model) != set(ref):
        raise Mismatch(f"tensor names differ: only in model {sorted(set(model) - set(ref))}, "
                       f"only in pack {sorted(set(ref) - set(model))}")
    for name in sorted(ref):
        a, b = model[name], ref[name]
        if a.dtype != b.dtype or a.shape != b.shape:
            raise Mismatch(f"{name}: {a.dtype}{a.shape} vs the pack's {b.dtype}{b.shape}")
        # Bit for bit: NaNs compare equal to themselves, -0.0 differs from 0.0.
        if a.tobytes() != b.tobytes():
            raise Mismatch(f"{name}: values differ")


def main(argv):
    if len(argv) not in (3, 4):
        print(__doc__)
        return 2
    model_dir, pack_path = argv[1], argv[2]
    expected = json.loads(argv[3]) if len(argv) == 4 else {}
    try:
        model, metas = load_model(model_dir)
        ref, _ = read_safetensors(pack_path)
        compare(model, ref)
        for name, meta in metas.items():
            if meta.get("format") != "pt":
                raise Mismatch(f"{name}: __metadata__.format is {meta.get('format')!r}, transformers needs 'pt'")
            for k, v in expected.items():
                if meta.get(k) != v:
                    raise Mismatch(f"{name}: __metadata__.{k} is {meta.get(k)!r}, expected {v!r}")
    except Mismatch as e:
        print(f"MISMATCH: {e}")
        return 1
    params = sum(v.size for v in model.values())
    print(f"OK: {len(model)} tensors, {params} parameters in {len(metas)} files equal the pack's")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
