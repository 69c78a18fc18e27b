"""Safetensors files and canonical parameter packs, with numpy buffers only.

The format (docs/formats.md): ``[8 bytes little-endian u64 N][N bytes JSON header][data]``.
Reading maps the file (``mmap``, private copy-on-write, so arrays are writable views and
nothing is copied until written); writing emits the header and then each array's buffer
with one ``write`` of a ``memoryview`` — no per-element work and no ``.tobytes()`` copies.

A *pack* is a canonical safetensors file: F32 only, tensors in ascending byte order of
their names, contiguous from offset 0, a compact sorted header padded with spaces so the
data starts at a multiple of 8, and ``__metadata__`` holding ``format`` and
``layout_hash`` (the hex sha256 of the layout string, equal to Go's ``pack.Layout.Hash``).
"""

import hashlib
import json
import math
import mmap
import os
import struct

import numpy as np

from .errors import SafetensorsError

PACK_FORMAT = "p2ptrain-pack/1"
MAX_HEADER_BYTES = 100 << 20

# dtype name -> (numpy dtype used for the raw view, element size). numpy has no bfloat16:
# BF16 data is viewed as little-endian uint16 and converted by the caller (torch can view it).
DTYPES = {
    "F64": (np.dtype("<f8"), 8),
    "F32": (np.dtype("<f4"), 4),
    "F16": (np.dtype("<f2"), 2),
    "BF16": (np.dtype("<u2"), 2),
    "I64": (np.dtype("<i8"), 8),
    "I32": (np.dtype("<i4"), 4),
    "I16": (np.dtype("<i2"), 2),
    "I8": (np.dtype("i1"), 1),
    "U8": (np.dtype("u1"), 1),
    "BOOL": (np.dtype("?"), 1),
}

_NUMPY_TO_DTYPE = {
    np.dtype("<f8"): "F64",
    np.dtype("<f4"): "F32",
    np.dtype("<f2"): "F16",
    np.dtype("<i8"): "I64",
    np.dtype("<i4"): "I32",
    np.dtype("<i2"): "I16",
    np.dtype("i1"): "I8",
    np.dtype("u1"): "U8",
    np.dtype("?"): "BOOL",
}


class TensorInfo:
    """One header entry; ``begin``/``end`` are relative to the first data byte."""

    __slots__ = ("name", "dtype", "shape", "begin", "end")

    def __init__(self, name, dtype, shape, begin, end):
        self.name, self.dtype, self.shape, self.begin, self.end = name, dtype, shape, begin, end

    @property
    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __repr__(self):
        return f"TensorInfo({self.name!r}, {self.dtype}, {self.shape}, [{self.begin}, {self.end}])"


def name_key(name):
    return name.encode("utf-8")


def parse_header(prefix_and_header, file_size):
    """Parse and validate a header.

    ``prefix_and_header`` holds at least the 8-byte length and the header; ``file_size`` is the
    size of the whole file. Returns ``(tensors sorted by offset, metadata dict, data_start)``.
    Raises SafetensorsError naming what is wrong.
    """
    buf = prefix_and_header
    if file_size < 8 or len(buf) < 8:
        raise SafetensorsError(f"file is {file_size} bytes, shorter than the 8-byte header length")
    (n,) = struct.unpack_from("<Q", buf, 0)
    if n < 2 or n > MAX_HEADER_BYTES:
        raise SafetensorsError(f"header length {n} out of range [2, {MAX_HEADER_BYTES}]")
    if 8 + n > file_size:
        raise SafetensorsError(f"header length {n} exceeds file size {file_size} (truncated file?)")
    if len(buf) < 8 + n:
        raise SafetensorsError(f"truncated header: need {8 + n} bytes, have {len(buf)}")
    raw = bytes(buf[8 : 8 + n]).rstrip(b" ")
    if not raw.startswith(b"{"):
        raise SafetensorsError("header is not a JSON object")
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise SafetensorsError(f"header is not valid UTF-8 JSON: {e}") from None
    if not isinstance(header, dict):
        raise SafetensorsError("header is not a JSON object")
    data_start = 8 + n
    data_len = file_size - data_start
    metadata = {}
    tensors = []
    for name, entry in header.items():
        if name == "__metadata__":
            if not isinstance(entry, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in entry.items()
            ):
                raise SafetensorsError("__metadata__ must map strings to strings")
            metadata = entry
            continue
        tensors.append(_check_entry(name, entry, data_len))
    tensors.sort(key=lambda t: (t.begin, t.end))
    for prev, cur in zip(tensors, tensors[1:]):
        if cur.begin < prev.end:
            raise SafetensorsError(f"tensors {prev.name!r} and {cur.name!r} overlap")
    return tensors, metadata, data_start


def _check_entry(name, entry, data_len):
    if not name:
        raise SafetensorsError("empty tensor name")
    if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
        raise SafetensorsError(f"tensor {name!r}: entry must have exactly dtype, shape, data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPES:
        raise SafetensorsError(f"tensor {name!r}: unknown dtype {dtype!r}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise SafetensorsError(f"tensor {name!r}: bad shape {shape!r}")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
    ):
        raise SafetensorsError(f"tensor {name!r}: bad data_offsets {offsets!r}")
    begin, end = offsets
    if begin < 0 or end < begin or end > data_len:
        raise SafetensorsError(
            f"tensor {name!r}: data offsets [{begin}, {end}] outside data of {data_len} bytes"
        )
    info = TensorInfo(name, dtype, tuple(shape), begin, end)
    want = info.numel * DTYPES[dtype][1]
    if end - begin != want:
        raise SafetensorsError(
            f"tensor {name!r}: {end - begin} bytes for shape {list(shape)} of {dtype} (want {want})"
        )
    return info


class File:
    """A safetensors file mapped privately (copy-on-write).

    ``array(name)`` returns a writable numpy view of the mapped bytes: reading costs page
    faults, not copies, and writing to the view never reaches the file. The mapping lives as
    long as any view does; ``close()`` only drops this object's reference.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if size < 8:
                raise SafetensorsError(f"{self.path}: file is {size} bytes, shorter than the 8-byte header length")
            (n,) = struct.unpack("<Q", os.pread(fd, 8, 0))
            if n < 2 or n > MAX_HEADER_BYTES:
                raise SafetensorsError(f"{self.path}: header length {n} out of range [2, {MAX_HEADER_BYTES}]")
            if 8 + n > size:
                raise SafetensorsError(f"{self.path}: header length {n} exceeds file size {size} (truncated file?)")
            head = os.pread(fd, 8 + n, 0)
            try:
                self.tensors, self.metadata, self.data_start = parse_header(head, size)
            except SafetensorsError as e:
                raise SafetensorsError(f"{self.path}: {e}") from None
            self.size = size
            # MAP_PRIVATE with write permission: views are writable (torch.from_numpy does not
            # warn) and pages are only copied if somebody writes to them.
            self._mm = mmap.mmap(fd, size, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self._by_name = {t.name: t for t in self.tensors}
        self._u8 = np.frombuffer(self._mm, dtype=np.uint8)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        self._u8 = None
        self._mm = None

    def names(self):
        """Tensor names in file (offset) order."""
        return [t.name for t in self.tensors]

    def info(self, name):
        try:
            return self._by_name[name]
        except KeyError:
            raise SafetensorsError(f"{self.path}: no tensor {name!r}") from None

    def array(self, name):
        """A numpy view of a tensor (BF16 comes back as uint16)."""
        t = self.info(name)
        np_dtype, _ = DTYPES[t.dtype]
        raw = self._u8[self.data_start + t.begin : self.data_start + t.end]
        return raw.view(np_dtype).reshape(t.shape)

    def layout(self):
        """``[(name, shape)]`` in file order."""
        return [(t.name, t.shape) for t in self.tensors]


def layout_string(entries):
    """The layout string of docs/formats.md for ``[(name, shape)]`` in pack order (F32)."""
    parts = []
    for name, shape in entries:
        parts.append(f"{name}:F32:{'x'.join(str(int(d)) for d in shape)}\n")
    return "".join(parts)


def layout_hash(entries):
    """Hex sha256 of the layout string; equals Go's ``pack.Layout.Hash()``."""
    return hashlib.sha256(layout_string(entries).encode("utf-8")).hexdigest()


def encode_header(infos, metadata):
    """Canonical header bytes (8-byte prefix included) for ``[TensorInfo]`` with offsets set.

    Sorted keys, no insignificant whitespace, padded with spaces so that the data starts at a
    multiple of 8 — byte-for-byte what Go's ``pack.EncodeHeader`` writes.
    """
    obj = {}
    for t in infos:
        if t.name in obj or t.name == "__metadata__":
            raise SafetensorsError(f"duplicate or reserved tensor name {t.name!r}")
        obj[t.name] = {"data_offsets": [t.begin, t.end], "dtype": t.dtype, "shape": list(t.shape)}
    if metadata:
        for k, v in metadata.items():
            if not isinstance(k, str) or not isinstance(v, str):
                raise SafetensorsError("__metadata__ must map strings to strings")
        obj["__metadata__"] = dict(metadata)
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    pad = (8 - len(text) % 8) % 8
    text += b" " * pad
    return struct.pack("<Q", len(text)) + text


def _as_array(a):
    """numpy array (C-contiguous, little-endian) and its dtype name."""
    a = np.asarray(a)
    if not a.flags.c_contiguous:
        a = np.ascontiguousarray(a)
    if a.dtype.byteorder == ">":
        a = a.astype(a.dtype.newbyteorder("<"))
    dt = _NUMPY_TO_DTYPE.get(a.dtype)
    if dt is None:
        raise SafetensorsError(f"cannot store numpy dtype {a.dtype} in safetensors")
    return a, dt


def _write_buffer(f, a):
    if a.size == 0:
        return
    mv = memoryview(a.reshape(-1).view(np.uint8))
    # Large single writes to tmpfs are slower than MiB-sized ones (measured), so write in
    # slices of the same buffer: still no copy.
    step = 1 << 20
    for off in range(0, len(mv), step):
        f.write(mv[off : off + step])


def write(path, tensors, metadata=None, order=None):
    """Write a safetensors file.

    ``tensors`` maps name -> numpy array, or name -> ``(dtype_name, shape, array)`` for raw
    buffers (e.g. BF16 as uint16), where ``array`` may also be a function that returns it
    when its turn to be written comes (``produce_in_order`` calls them the same way): a
    model gathered from shards is then never whole in memory. Tensors are stored in
    ascending byte order of their names unless ``order`` gives the names. The file is
    written to a temporary name and renamed.
    """
    path = os.fspath(path)
    names = list(order) if order is not None else sorted(tensors, key=name_key)
    infos, arrays = [], []
    off = 0
    for name in names:
        v = tensors[name]
        if isinstance(v, tuple):
            dt, shape, a = v
            if not callable(a):
                a = np.ascontiguousarray(a)
            shape = tuple(int(d) for d in shape)
            nbytes = math.prod(shape) * DTYPES[dt][1] if callable(a) else a.size * a.itemsize
        else:
            a, dt = _as_array(v)
            shape = tuple(int(d) for d in a.shape)
            nbytes = a.size * a.itemsize
        info = TensorInfo(name, dt, shape, off, off + nbytes)
        if info.numel * DTYPES[dt][1] != nbytes:
            raise SafetensorsError(f"tensor {name!r}: {nbytes} bytes for shape {list(shape)} of {dt}")
        infos.append(info)
        arrays.append((info, a))
        off += nbytes
    header = encode_header(infos, metadata or {})
    _atomic_write(path, header, arrays)


def produce_in_order(tensors, order=None):
    """Call the functions among ``write``'s values in the order ``write`` would, dropping
    their arrays: what a rank that holds a shard but writes nothing does while another
    rank writes the file, so that their collective gathers pair up."""
    for name in list(order) if order is not None else sorted(tensors, key=name_key):
        v = tensors[name]
        if isinstance(v, tuple) and callable(v[2]):
            v[2]()


def _atomic_write(path, header, arrays):
    d = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(d, f".{os.path.basename(path)}.tmp{os.getpid()}")
    try:
        with open(tmp, "wb", buffering=0) as f:
            f.write(header)
            for info, a in arrays:
                if callable(a):
                    a = np.ascontiguousarray(a())
                    if a.size * a.itemsize != info.end - info.begin:
                        raise SafetensorsError(
                            f"tensor {info.name!r}: produced {a.size * a.itemsize} bytes, its header says {info.end - info.begin}"
                        )
                _write_buffer(f, a)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def pack_metadata(entries, extra=None):
    meta = dict(extra or {})
    meta["format"] = PACK_FORMAT
    meta["layout_hash"] = layout_hash(entries)
    return meta


def write_pack(path, arrays, extra_metadata=None):
    """Write a canonical pack from ``[(name, float32 array)]`` (any order; sorted here).
    An array may be ``(shape, function)``: the function returns the float32 array when its
    turn comes (``write``)."""
    items = sorted(arrays, key=lambda kv: name_key(kv[0]))
    for (a, _), (b, _) in zip(items, items[1:]):
        if a == b:
            raise SafetensorsError(f"duplicate tensor name {a!r}")
    tensors, entries = {}, []
    for name, a in items:
        if isinstance(a, tuple):
            shape, produce = a
            tensors[name] = ("F32", shape, _float32_from(name, produce))
            entries.append((name, tuple(int(d) for d in shape)))
            continue
        a = np.asarray(a)
        if a.dtype != np.dtype("<f4"):
            raise SafetensorsError(f"pack tensor {name!r} is {a.dtype}, packs hold float32 only")
        tensors[name] = a
        entries.append((name, tuple(a.shape)))
    write(path, tensors, pack_metadata(entries, extra_metadata), order=[n for n, _ in items])
    return layout_hash(entries)


def _float32_from(name, produce):
    def checked():
        a = np.asarray(produce())
        if a.dtype != np.dtype("<f4"):
            raise SafetensorsError(f"pack tensor {name!r} is {a.dtype}, packs hold float32 only")
        return a

    return checked


class Pack(File):
    """A canonical pack, checked on open: F32 only, name order, contiguous, and (when present)
    the metadata's layout hash equal to the hash of the tensors it holds."""

    def __init__(self, path):
        super().__init__(path)
        try:
            self._check()
        except BaseException:
            self.close()
            raise

    def _check(self):
        nxt = 0
        for t in self.tensors:
            if t.dtype != "F32":
                raise SafetensorsError(f"{self.path}: not a pack: tensor {t.name!r} is {t.dtype}, packs hold F32 only")
            if t.begin != nxt:
                raise SafetensorsError(
                    f"{self.path}: not a pack: tensor {t.name!r} starts at {t.begin}, expected {nxt} (packs are contiguous)"
                )
            nxt = t.end
        keys = [name_key(t.name) for t in self.tensors]
        if any(a >= b for a, b in zip(keys, keys[1:])):
            raise SafetensorsError(f"{self.path}: not a pack: tensors are not stored in name order")
        if self.size - self.data_start != nxt:
            raise SafetensorsError(
                f"{self.path}: not a pack: {self.size - self.data_start} data bytes, tensors cover {nxt}"
            )
        self.layout_hash = layout_hash(self.layout())
        want = self.metadata.get("layout_hash")
        if want is not None and want != self.layout_hash:
            raise SafetensorsError(
                f"{self.path}: header says layout_hash {want} but its tensors hash to {self.layout_hash}"
            )

    @property
    def param_count(self):
        return sum(t.numel for t in self.tensors)
