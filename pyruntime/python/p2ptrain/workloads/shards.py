"""Deterministic shard files: the same arrays always give the same bytes (and CIDs)."""

import io
import json
import os
import zipfile

import numpy as np

_EPOCH = (1980, 1, 1, 0, 0, 0)


def write_npz(path, **arrays):
    """Write an uncompressed .npz like ``np.savez`` but with fixed zip timestamps, so that
    the bytes depend only on the arrays (``np.savez`` stamps the current time)."""
    tmp = f"{path}.tmp{os.getpid()}"
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
        for name in sorted(arrays):
            info = zipfile.ZipInfo(name + ".npy", date_time=_EPOCH)
            info.external_attr = 0o644 << 16
            buf = io.BytesIO()
            np.lib.format.write_array(buf, np.ascontiguousarray(arrays[name]), allow_pickle=False)
            zf.writestr(info, buf.getvalue())
    os.replace(tmp, path)


def read_npz(path, *names):
    """Read arrays from an .npz without ever unpickling."""
    with np.load(path, allow_pickle=False) as z:
        missing = [n for n in names if n not in z.files]
        if missing:
            raise ValueError(f"{path}: missing arrays {missing} (has {z.files})")
        return tuple(z[n] for n in names)


def write_examples(out_dir, counts):
    """Write the ``examples.json`` sidecar: {file name: example count}."""
    tmp = os.path.join(out_dir, f".examples.json.tmp{os.getpid()}")
    with open(tmp, "w") as f:
        json.dump(dict(sorted(counts.items())), f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, os.path.join(out_dir, "examples.json"))


def shard_name(i, ext):
    return f"shard-{i:05d}.{ext}"
