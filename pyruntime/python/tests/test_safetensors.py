import json
import os
import struct
import tempfile
import unittest

import numpy as np

from p2ptrain import safetensors as st
from p2ptrain.errors import SafetensorsError


def raw_file(path, header, data=b"", pad=True):
    """Write a safetensors file from a header dict (or raw header bytes) and data bytes."""
    h = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if pad:
        h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + data)


class SafetensorsTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.dir = self.tmp.name

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.dir, name)

    def test_round_trip_dtypes(self):
        tensors = {
            "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
            "f64": np.linspace(0, 1, 5),
            "f16": np.array([1.5, -2.0], dtype=np.float16),
            "i64": np.array([[1, 2], [3, -4]], dtype=np.int64),
            "u8": np.array([1, 2, 255], dtype=np.uint8),
            "flag": np.array([True, False]),
            "scalar": np.array(3.25, dtype=np.float32),
            "empty": np.zeros((0, 3), dtype=np.float32),
            "bf16": ("BF16", (2,), np.array([0x3F80, 0x4000], dtype=np.uint16)),
        }
        p = self.path("a.safetensors")
        st.write(p, tensors, {"k": "v"})
        with st.File(p) as f:
            self.assertEqual(f.metadata, {"k": "v"})
            self.assertEqual(sorted(f.names()), sorted(tensors))
            for name, v in tensors.items():
                want = v[2] if isinstance(v, tuple) else v
                got = f.array(name)
                self.assertEqual(got.shape, want.shape, name)
                np.testing.assert_array_equal(got, want, err_msg=name)
            self.assertEqual(f.info("bf16").dtype, "BF16")
            self.assertEqual(f.data_start % 8, 0)

    def test_canonical_header(self):
        p = self.path("c.safetensors")
        st.write(p, {"b": np.zeros(2, np.float32), "a": np.ones(3, np.float32)}, {"z": "1"})
        with open(p, "rb") as f:
            b = f.read()
        (n,) = struct.unpack("<Q", b[:8])
        self.assertEqual((8 + n) % 8, 0)
        text = b[8 : 8 + n].rstrip(b" ")
        self.assertEqual(
            text,
            b'{"__metadata__":{"z":"1"},"a":{"data_offsets":[0,12],"dtype":"F32","shape":[3]},'
            b'"b":{"data_offsets":[12,20],"dtype":"F32","shape":[2]}}',
        )

    def test_views_are_writable_copy_on_write(self):
        p = self.path("w.safetensors")
        st.write(p, {"x": np.arange(4, dtype=np.float32)})
        with st.File(p) as f:
            a = f.array("x")
            a[0] = 42  # private mapping: the file does not change
        with st.File(p) as f:
            self.assertEqual(f.array("x")[0], 0)

    def test_layout_hash_known_answer(self):
        # Computed by Go's pack.Layout.Hash() for the same layout.
        entries = [("fc1.bias", (128,)), ("fc1.weight", (128, 64)), ("scalar", ())]
        self.assertEqual(st.layout_string(entries), "fc1.bias:F32:128\nfc1.weight:F32:128x64\nscalar:F32:\n")
        self.assertEqual(st.layout_hash(entries), "ab4289ab75985dc324910edd58e6d96a981caa621d6e1742db5fe99549acb7f2")

    def test_pack_write_and_read(self):
        p = self.path("p.safetensors")
        h = st.write_pack(p, [("w", np.ones((2, 2), np.float32)), ("b", np.zeros(2, np.float32))])
        with st.Pack(p) as pk:
            self.assertEqual(pk.names(), ["b", "w"])
            self.assertEqual(pk.layout_hash, h)
            self.assertEqual(pk.metadata["format"], st.PACK_FORMAT)
            self.assertEqual(pk.metadata["layout_hash"], h)
            self.assertEqual(pk.param_count, 6)

    def test_pack_writer_rejects_non_f32(self):
        with self.assertRaisesRegex(SafetensorsError, "float32 only"):
            st.write_pack(self.path("x"), [("w", np.ones(2, np.float64))])

    # ---- malformed files -------------------------------------------------------------

    def assertRejected(self, pattern, cls=st.File):
        with self.assertRaisesRegex(SafetensorsError, pattern):
            cls(self.path("bad.safetensors"))

    def test_short_file(self):
        with open(self.path("bad.safetensors"), "wb") as f:
            f.write(b"\x01\x02")
        self.assertRejected("shorter than the 8-byte header length")

    def test_bad_header_length(self):
        with open(self.path("bad.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", 1 << 40) + b"{}")
        self.assertRejected("header length .* out of range")
        with open(self.path("bad.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", 1) + b"{")
        self.assertRejected("out of range")

    def test_truncated_header(self):
        with open(self.path("bad.safetensors"), "wb") as f:
            f.write(struct.pack("<Q", 100) + b'{"a":')
        self.assertRejected("exceeds file size")

    def test_truncated_data(self):
        raw_file(self.path("bad.safetensors"), {"x": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}}, b"\0" * 8)
        self.assertRejected("outside data of 8 bytes")

    def test_not_json(self):
        raw_file(self.path("bad.safetensors"), b'{"x": nope}')
        self.assertRejected("not valid UTF-8 JSON")
        raw_file(self.path("bad.safetensors"), b"[1, 2]")
        self.assertRejected("not a JSON object")

    def test_unknown_dtype(self):
        raw_file(self.path("bad.safetensors"), {"x": {"dtype": "F8", "shape": [1], "data_offsets": [0, 1]}}, b"\0")
        self.assertRejected("unknown dtype")

    def test_size_mismatch(self):
        raw_file(self.path("bad.safetensors"), {"x": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, b"\0" * 8)
        self.assertRejected("8 bytes for shape")

    def test_overlapping_offsets(self):
        raw_file(
            self.path("bad.safetensors"),
            {
                "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
            },
            b"\0" * 12,
        )
        self.assertRejected("overlap")

    def test_bad_metadata(self):
        raw_file(self.path("bad.safetensors"), {"__metadata__": {"a": 1}})
        self.assertRejected("__metadata__ must map strings to strings")

    def test_pack_rejects_non_f32(self):
        raw_file(self.path("bad.safetensors"), {"x": {"dtype": "F64", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8)
        self.assertRejected("F64, packs hold F32 only", st.Pack)

    def test_pack_rejects_gaps_and_order(self):
        raw_file(
            self.path("bad.safetensors"),
            {
                "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]},
            },
            b"\0" * 12,
        )
        self.assertRejected("packs are contiguous", st.Pack)
        raw_file(
            self.path("bad.safetensors"),
            {
                "b": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
                "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
            },
            b"\0" * 8,
        )
        self.assertRejected("not stored in name order", st.Pack)

    def test_pack_rejects_wrong_layout_hash(self):
        raw_file(
            self.path("bad.safetensors"),
            {"__metadata__": {"layout_hash": "00" * 32}, "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}},
            b"\0" * 4,
        )
        self.assertRejected("header says layout_hash", st.Pack)

    def test_mutated_files_fail_cleanly(self):
        """Random byte flips in a valid file: parsing succeeds or raises SafetensorsError."""
        good = self.path("good.safetensors")
        st.write_pack(good, [("a.w", np.ones((3, 2), np.float32)), ("b", np.zeros(5, np.float32))])
        with open(good, "rb") as f:
            orig = f.read()
        rng = np.random.RandomState(7)
        bad = self.path("bad.safetensors")
        for _ in range(400):
            b = bytearray(orig)
            for _ in range(rng.randint(1, 4)):
                i = rng.randint(0, min(len(b), 8 + 200))
                b[i] = rng.randint(0, 256)
            if rng.rand() < 0.2:
                b = b[: rng.randint(0, len(b))]
            with open(bad, "wb") as f:
                f.write(b)
            for cls in (st.File, st.Pack):
                try:
                    cls(bad).close()
                except SafetensorsError:
                    pass


if __name__ == "__main__":
    unittest.main()
