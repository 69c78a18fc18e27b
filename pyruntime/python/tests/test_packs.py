import os
import tempfile
import unittest

import torch
from torch import nn

from p2ptrain import packs, safetensors as st
from p2ptrain.errors import BadRequest, LayoutMismatch, NonFinite

torch.set_num_threads(1)


def model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2))


class PacksTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp.name, name)

    def test_selects_floating_tensors_in_name_order(self):
        spec = packs.PackSpec(model())
        # num_batches_tracked is int64: never in a pack.
        self.assertEqual(
            spec.names,
            ["0.bias", "0.weight", "1.bias", "1.running_mean", "1.running_var", "1.weight", "3.bias", "3.weight"],
        )
        self.assertEqual(spec.param_count, 8 + 32 + 8 * 4 + 2 + 16)
        self.assertEqual(spec.buffers, ["1.running_mean", "1.running_var"])

    def test_pack_names_its_buffers(self):
        spec = packs.PackSpec(model())
        packs.export_pack(spec, self.path("b.safetensors"))
        with st.Pack(self.path("b.safetensors")) as p:
            self.assertEqual(p.metadata["buffers"], "1.running_mean,1.running_var")
        spec = packs.PackSpec(model(), exclude=["1.running_*"])
        packs.export_pack(spec, self.path("c.safetensors"))
        with st.Pack(self.path("c.safetensors")) as p:
            self.assertNotIn("buffers", p.metadata)

    def test_globs(self):
        m = model()
        self.assertEqual(packs.PackSpec(m, include=["0.*"]).names, ["0.bias", "0.weight"])
        self.assertEqual(
            packs.PackSpec(m, exclude=["1.running_*", "*.bias"]).names, ["0.weight", "1.weight", "3.weight"]
        )
        self.assertEqual(packs.PackSpec(m, include=["[03].weight"]).names, ["0.weight", "3.weight"])
        with self.assertRaises(BadRequest):
            packs.PackSpec(m, include=[" "])
        with self.assertRaises(BadRequest):
            packs.PackSpec(m, include="0.*")

    def test_export_load_round_trip(self):
        a, b = model(), model()
        with torch.no_grad():
            for p in b.parameters():
                p.add_(1.0)
        sa, sb = packs.PackSpec(a), packs.PackSpec(b)
        path = self.path("a.safetensors")
        h = packs.export_pack(sa, path)
        self.assertEqual(h, sa.layout_hash)
        packs.load_pack(sb, path)
        for (na, ta), (nb, tb) in zip(a.state_dict().items(), b.state_dict().items()):
            self.assertEqual(na, nb)
            self.assertTrue(torch.equal(ta, tb), na)
        # Exported bytes are canonical: exporting the loaded model gives the same file.
        packs.export_pack(sb, self.path("b.safetensors"))
        with open(path, "rb") as f1, open(self.path("b.safetensors"), "rb") as f2:
            self.assertEqual(f1.read(), f2.read())

    def test_excluded_tensors_stay(self):
        a, b = model(), model()
        with torch.no_grad():
            b[3].bias.fill_(7)
        sa = packs.PackSpec(a, exclude=["3.bias"])
        path = self.path("a.safetensors")
        packs.export_pack(sa, path)
        packs.load_pack(packs.PackSpec(b, exclude=["3.bias"]), path)
        self.assertTrue(torch.all(b[3].bias == 7))
        self.assertTrue(torch.equal(a[3].weight, b[3].weight))

    def test_layout_mismatch_names_both_hashes(self):
        path = self.path("a.safetensors")
        packs.export_pack(packs.PackSpec(model(), include=["0.*"]), path)
        spec = packs.PackSpec(model())
        with st.Pack(path) as p:
            other = p.layout_hash
        with self.assertRaises(LayoutMismatch) as cm:
            packs.load_pack(spec, path)
        self.assertIn(other, str(cm.exception))
        self.assertIn(spec.layout_hash, str(cm.exception))

    def test_check_finite(self):
        m = model()
        spec = packs.PackSpec(m)
        packs.check_finite(spec)
        with torch.no_grad():
            m[3].weight[0, 0] = float("inf")
        with self.assertRaisesRegex(NonFinite, "3.weight"):
            packs.check_finite(spec)

    def test_half_precision_model(self):
        m = model().half()
        spec = packs.PackSpec(m)
        path = self.path("h.safetensors")
        packs.export_pack(spec, path)
        with st.Pack(path) as p:
            self.assertEqual({t.dtype for t in p.tensors}, {"F32"})
        packs.load_pack(spec, path)


if __name__ == "__main__":
    unittest.main()
