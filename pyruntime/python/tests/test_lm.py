import glob
import io
import json
import os
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stderr

import numpy as np
import torch

from p2ptrain import modelconfig, optstate, prepare, safetensors as st, sample
from p2ptrain.errors import BadRequest, LayoutMismatch, WorkloadError
from p2ptrain.session import Session
from p2ptrain.workloads import lm

torch.set_num_threads(1)

LM = "p2ptrain.workloads.lm:LM"
# The tiny preset shrunk further so that a CPU test trains in seconds.
SMALL = {"preset": "tiny", "layers": 2, "width": 64, "heads": 2, "context": 32, "batch_size": 8,
         "corpus_bytes": 400_000, "shard_bytes": 16384, "eval_bytes": 4096, "warmup": 10, "decay_steps": 200}


def read(path):
    with open(path, "rb") as f:
        return f.read()


class ConfigTest(unittest.TestCase):
    def test_presets_parameter_counts(self):
        want = {"tiny": (0.9e6, 1.2e6), "small": (9e6, 12e6), "base": (80e6, 130e6)}
        for name, (lo, hi) in want.items():
            hp = lm.resolve_config({"preset": name})
            n = lm.param_count(*(hp[k] for k in lm.MODEL_KEYS))
            self.assertTrue(lo <= n <= hi, f"{name}: {n} parameters")
        base = lm.resolve_config({"preset": "base"})
        self.assertEqual((base["layers"], base["width"], base["heads"], base["context"]), (12, 768, 12, 1024))
        for name in ("tiny", "small"):
            hp = lm.resolve_config({"preset": name})
            m = lm.build_transformer(*(hp[k] for k in lm.MODEL_KEYS))
            self.assertEqual(sum(p.numel() for p in m.parameters()), lm.param_count(*(hp[k] for k in lm.MODEL_KEYS)))

    def test_overrides_key_by_key(self):
        hp = lm.resolve_config({"preset": "small", "layers": 2, "lr": 1e-4, "warmup": 0, "weight_decay": 0.0})
        self.assertEqual((hp["layers"], hp["width"], hp["lr"], hp["warmup"], hp["weight_decay"]), (2, 384, 1e-4, 0, 0.0))
        self.assertEqual(lm.resolve_config({})["preset"], "tiny")

    def test_tokens_per_sample_is_the_context(self):
        self.assertEqual(lm.LM({}).tokens_per_sample, 128)
        self.assertEqual(lm.LM({"preset": "small", "context": 64}).tokens_per_sample, 64)

    def test_bad_config_names_the_key(self):
        cases = [
            ({"preset": "huge"}, "preset"),
            ({"layerz": 3}, "layerz"),
            ({"width": 100, "heads": 3}, "heads"),
            ({"context": 0}, "context"),
            ({"batch_size": 2.5}, "batch_size"),
            ({"lr": "fast"}, "lr"),
            ({"holdout": 0.9}, "holdout"),
        ]
        for cfg, key in cases:
            with self.subTest(cfg=cfg):
                with self.assertRaisesRegex(ValueError, f"workload.config.{key}"):
                    lm.resolve_config(cfg)

    def test_corpus_shorter_than_context(self):
        w = lm.LM({"corpus_bytes": 500, "context": 128, "shard_bytes": 256})
        with tempfile.TemporaryDirectory() as d:
            with self.assertRaisesRegex(WorkloadError, "corpus_bytes"):
                prepare.prepare(LM, {"corpus_bytes": 500, "context": 128, "shard_bytes": 256}, d)
            self.assertEqual(os.listdir(d), [])
        with self.assertRaisesRegex(ValueError, "context"):
            w.split()

    def test_whole_corpus(self):
        # corpus_bytes 0 (small and base) reads the whole stdlib, without a huge read buffer.
        train, held = lm.LM({"preset": "small"}).split()
        total = sum(len(b) for b in train) + len(held)
        self.assertGreater(total, 5_000_000)
        self.assertAlmostEqual(len(held) / total, 0.05, delta=0.01)

    def test_lr_schedule(self):
        f = lambda s: lm.lr_factor(s, 10, 110, 0.1)
        self.assertAlmostEqual(f(1), 0.1)
        self.assertAlmostEqual(f(10), 1.0)
        self.assertAlmostEqual(f(60), 0.55)
        self.assertAlmostEqual(f(110), 0.1)
        self.assertAlmostEqual(f(10_000), 0.1)
        vals = [f(s) for s in range(10, 111)]
        self.assertTrue(all(a >= b for a, b in zip(vals, vals[1:])))


class ModelTest(unittest.TestCase):
    def test_causal(self):
        torch.manual_seed(0)
        m = lm.build_transformer(2, 32, 4, 16).eval()
        x = torch.randint(0, 256, (2, 16))
        y = x.clone()
        y[:, 10:] = torch.randint(0, 256, (2, 6))
        with torch.no_grad():
            a, b = m(x), m(y)
        self.assertTrue(torch.equal(a[:, :10], b[:, :10]))
        self.assertFalse(torch.allclose(a[:, 10:], b[:, 10:]))

    def test_tied_head_and_pack_names(self):
        m = lm.build_transformer(1, 32, 2, 8)
        names = list(m.state_dict())
        self.assertIn("tok.weight", names)
        self.assertFalse(any("mask" in n or "head" in n for n in names), names)

    def test_context_overflow(self):
        m = lm.build_transformer(1, 32, 2, 8)
        with self.assertRaisesRegex(ValueError, "context 8"):
            m(torch.zeros(1, 9, dtype=torch.int64))


class DataTest(unittest.TestCase):
    def test_prepare_deterministic_and_holdout_disjoint(self):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            prepare.prepare(LM, SMALL, a)
            prepare.prepare(LM, SMALL, b)
            fa = sorted(glob.glob(os.path.join(a, "shard-*.txt")))
            self.assertGreater(len(fa), 10)
            for p in fa:
                with open(p, "rb") as x, open(os.path.join(b, os.path.basename(p)), "rb") as y:
                    self.assertEqual(x.read(), y.read())
            train = b"".join(read(p) for p in fa)
            _, held = lm.LM(SMALL).split()
            self.assertEqual(len(train) + len(held), SMALL["corpus_bytes"])
            # Held-out blocks are not in the training shards.
            for lo in range(0, len(held) - 256, 4096):
                self.assertNotIn(held[lo : lo + 256], train)
            with open(os.path.join(a, "examples.json")) as f:
                self.assertEqual(sorted(json.load(f)), [os.path.basename(p) for p in fa])


class TrainTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.data = os.path.join(cls.tmp.name, "data")
        prepare.prepare(LM, SMALL, cls.data)
        cls.shards = sorted(glob.glob(os.path.join(cls.data, "shard-*.txt")))

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_loss_falls_and_schedule_continues_across_rounds(self):
        s = Session(LM, SMALL, seed=3)
        first = s.evaluate()["metrics"]
        self.assertAlmostEqual(first["bits_per_byte"], first["loss"] / np.log(2))
        opt = os.path.join(self.tmp.name, "opt.safetensors")
        out = os.path.join(self.tmp.name, "out.safetensors")
        lrs = []
        for r in range(3):
            res = s.train(out if r else None, self.shards[:6], 15, seed=r, opt_in=opt if r else None, opt_out=opt, out=out)
            lrs.append(res["metrics"]["lr"])
        # Step 15, 30, 45 of the schedule (warm-up 10, cosine to step 200), not step 15 thrice.
        want = [lm.PRESETS["tiny"]["lr"] * lm.lr_factor(s, 10, 200, 0.1) for s in (15, 30, 45)]
        for got, w in zip(lrs, want):
            self.assertAlmostEqual(got, w, places=9)
        o = Session(LM, SMALL, seed=3)._optimizer()
        optstate.load(o, opt)
        self.assertEqual(o.steps_taken(), 45)
        last = s.evaluate()["metrics"]
        self.assertLess(last["loss"], first["loss"] - 1.0, (first, last))

    def test_model_config_and_sample(self):
        s = Session(LM, SMALL, seed=1)
        s.train(None, self.shards[:4], 20, seed=0, out=os.path.join(self.tmp.name, "p.safetensors"))
        d = os.path.join(self.tmp.name, "export")
        os.makedirs(d, exist_ok=True)
        sd = {k: v.numpy() for k, v in s.model.state_dict().items()}
        st.write(os.path.join(d, "model.safetensors"), sd)
        cfg = modelconfig.model_config(LM, SMALL)
        self.assertEqual(cfg["model_type"], lm.MODEL_TYPE)
        self.assertEqual((cfg["layers"], cfg["width"], cfg["heads"], cfg["context"]), (2, 64, 2, 32))
        self.assertIsNone(modelconfig.model_config("p2ptrain.workloads.digits:Digits", {}))
        with self.assertRaisesRegex(BadRequest, "config.json"):
            sample.load_model(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        model, _ = sample.load_model(d)
        for k, v in model.state_dict().items():
            self.assertTrue(np.array_equal(v.numpy(), sd[k]), k)
        a = sample.generate(model, b"def ", 40, seed=7)
        b = sample.generate(model, b"def ", 40, seed=7)
        c = sample.generate(model, b"def ", 40, seed=8)
        self.assertEqual(len(a), 40)
        self.assertEqual(a, b)
        self.assertNotEqual(a, c)
        # More tokens than the context: the window slides.
        self.assertEqual(len(sample.generate(model, b"x" * 32, 50, seed=1)), 50)
        with self.assertRaisesRegex(BadRequest, "--prompt: 33 bytes"):
            sample.generate(model, b"x" * 33, 5, seed=1)
        # A config whose shapes disagree with the safetensors names the file and the tensor.
        bad = dict(cfg, width=96, heads=2)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(bad, f)
        with self.assertRaisesRegex(LayoutMismatch, r"model\.safetensors: tensor '[a-z0-9_.]+' is F32\[.*config\.json"):
            sample.load_model(d)
        bad = dict(cfg, layers=3)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(bad, f)
        with self.assertRaisesRegex(LayoutMismatch, "blocks.2"):
            sample.load_model(d)
        bad = dict(cfg)
        del bad["context"]
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(bad, f)
        with self.assertRaisesRegex(BadRequest, "'context'"):
            sample.load_model(d)
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump(cfg, f)
        # The command line: same seed, same bytes; prompt + N bytes + newline.
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(sample.__file__))))
        run = lambda seed: subprocess.run(
            [sys.executable, "-m", "p2ptrain.sample", "--model", d, "--prompt", "import ", "--tokens", "30", "--seed", str(seed)],
            capture_output=True, env=env, check=True).stdout
        o1, o2 = run(5), run(5)
        self.assertEqual(o1, o2)
        self.assertEqual(len(o1), len("import ") + 30 + 1)
        self.assertTrue(o1.startswith(b"import "))
        p = subprocess.run([sys.executable, "-m", "p2ptrain.sample", "--model", self.tmp.name, "--tokens", "3"],
                           capture_output=True, env=env)
        self.assertEqual(p.returncode, 2)
        self.assertIn(b"config.json", p.stderr)


if __name__ == "__main__":
    unittest.main()
