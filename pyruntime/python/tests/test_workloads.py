import glob
import json
import os
import tempfile
import unittest

import numpy as np
import torch

from p2ptrain import prepare, safetensors as st
from p2ptrain.session import Session
from p2ptrain.workloads import digits as digits_mod
from p2ptrain.workloads.shards import read_npz

torch.set_num_threads(1)

DIGITS = "p2ptrain.workloads.digits:Digits"
CHARLM = "p2ptrain.workloads.charlm:CharLM"
BENCH = "p2ptrain.workloads.bench:Bench"


class DigitsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.data = os.path.join(cls.tmp.name, "digits")
        prepare.prepare(DIGITS, {}, cls.data)
        cls.shards = sorted(glob.glob(os.path.join(cls.data, "shard-*.npz")))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_shards_and_sidecar(self):
        with open(os.path.join(self.data, "examples.json")) as f:
            counts = json.load(f)
        self.assertEqual(sorted(counts), [os.path.basename(p) for p in self.shards])
        self.assertEqual(sum(counts.values()), 1797 - 359)
        self.assertEqual(counts["shard-00000.npz"], 64)
        x, y = read_npz(self.shards[0], "x", "y")
        self.assertEqual((x.dtype, x.shape, y.dtype), (np.float32, (64, 64), np.int64))
        self.assertLessEqual(float(x.max()), 1.0)

    def test_heldout_never_in_shards(self):
        x, y = digits_mod.load_all()
        train, test = digits_mod.split_indices(len(y))
        self.assertEqual(len(test), 359)
        self.assertFalse(set(train) & set(test))
        self.assertEqual(len(set(train) | set(test)), 1797)
        # The shards hold exactly the train examples, in order.
        xs = np.concatenate([read_npz(p, "x")[0] for p in self.shards])
        ys = np.concatenate([read_npz(p, "y")[0] for p in self.shards])
        np.testing.assert_array_equal(xs, x[train])
        np.testing.assert_array_equal(ys, y[train])

    def test_prepare_is_deterministic(self):
        other = os.path.join(self.tmp.name, "again")
        prepare.prepare(DIGITS, {}, other)
        for p in self.shards:
            with open(p, "rb") as a, open(os.path.join(other, os.path.basename(p)), "rb") as b:
                self.assertEqual(a.read(), b.read(), p)

    def test_training_lowers_loss(self):
        s = Session(DIGITS, {}, device="cpu", seed=0)
        self.assertEqual(s.spec.param_count, 64 * 128 + 128 + 128 * 128 + 128 + 128 * 10 + 10)
        base, out = os.path.join(self.tmp.name, "b.st"), os.path.join(self.tmp.name, "o.st")
        s.init(3, base)
        before = s.evaluate(base)["metrics"]
        r = s.train(base, self.shards, 200, 1, None, os.path.join(self.tmp.name, "opt.st"), out)
        after = s.evaluate(out)["metrics"]
        self.assertEqual(r["steps"], 200)
        self.assertLess(r["loss_last"], r["loss_first"] / 3)
        self.assertLess(after["loss"], before["loss"])
        self.assertGreater(after["accuracy"], 0.9)

    def test_train_cycles_and_counts_samples(self):
        s = Session(DIGITS, {"batch_size": 100}, device="cpu")
        out = os.path.join(self.tmp.name, "c.st")
        r = s.train(None, self.shards[:1], 5, 0, None, None, out)  # 64 examples: one batch per pass
        self.assertEqual((r["steps"], r["samples"]), (5, 5 * 64))


class CharLMTest(unittest.TestCase):
    def test_prepare_train_evaluate(self):
        cfg = {"corpus_bytes": 60000, "shard_bytes": 16384, "eval_bytes": 4000, "hidden": 64, "embed": 16}
        with tempfile.TemporaryDirectory() as d:
            prepare.prepare(CHARLM, cfg, d)
            shards = sorted(glob.glob(os.path.join(d, "shard-*.txt")))
            self.assertEqual(len(shards), 4)  # 54000 train bytes
            with open(os.path.join(d, "examples.json")) as f:
                self.assertEqual(json.load(f)["shard-00000.txt"], 16384 // 64)
            s = Session(CHARLM, cfg, device="cpu")
            before = s.evaluate()["metrics"]
            self.assertEqual(set(before), {"loss", "bits_per_char", "accuracy"})
            self.assertAlmostEqual(before["bits_per_char"], 8.0, delta=0.5)  # uniform over 256 bytes
            r = s.train(None, shards, 60, 0, None, None, os.path.join(d, "o.st"))
            after = s.evaluate()["metrics"]
            self.assertLess(r["loss_last"], r["loss_first"])
            self.assertLess(after["bits_per_char"], before["bits_per_char"] - 1)

    def test_default_size(self):
        s = Session(CHARLM, {}, device="cpu")
        self.assertTrue(200_000 < s.spec.param_count < 500_000, s.spec.param_count)


class BenchTest(unittest.TestCase):
    def test_exact_param_count_and_methods(self):
        for n, width in [(1000, 16), (5, 16), (3 * (64 * 64 + 64) + 7, 64)]:
            s = Session(BENCH, {"params": n, "width": width}, device="cpu")
            self.assertEqual(s.spec.param_count, n)
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "o.st")
            r = s.train(None, ["ignored"], 3, 0, None, None, out)
            self.assertEqual(r["steps"], 3)
            with st.Pack(out) as p:
                self.assertEqual(p.param_count, n)
            self.assertIn("loss", s.evaluate()["metrics"])


if __name__ == "__main__":
    unittest.main()
