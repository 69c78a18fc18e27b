"""workload.device and workload.precision: bad values fail at hello naming the setting; bf16
trains on the CPU; the tiny LM trains on CUDA in every precision where a GPU exists.

The CUDA tests are skipped on machines without a GPU, also under CI=true: a machine with no
GPU is not a broken setup (see internal/testenv)."""

import glob
import os
import tempfile
import unittest

import torch

from p2ptrain import prepare
from p2ptrain.errors import BadRequest
from p2ptrain.session import Session, check_precision, pick_device

torch.set_num_threads(1)

TINY = "p2ptrain.testing:Tiny"
CHARLM = "p2ptrain.workloads.charlm:CharLM"
LM_CFG = {"corpus_bytes": 60000, "shard_bytes": 16384, "eval_bytes": 4000, "hidden": 64, "embed": 16}


class BadDeviceAndPrecisionTest(unittest.TestCase):
    def test_unknown_device_names_the_setting(self):
        for bad in ("gpu0", "cuda:x", "tpu"):
            with self.assertRaises(BadRequest) as cm:
                pick_device(bad)
            self.assertIn("workload.device", str(cm.exception))
            self.assertIn(repr(bad), str(cm.exception))

    @unittest.skipIf(torch.cuda.is_available(), "this machine has a GPU")
    def test_cuda_without_a_gpu(self):
        for want in ("cuda", "cuda:1"):
            with self.assertRaises(BadRequest) as cm:
                pick_device(want)
            self.assertIn("workload.device", str(cm.exception))
            self.assertIn("torch.cuda.is_available() is false", str(cm.exception))

    def test_cuda_index_beyond_the_devices(self):
        if not torch.cuda.is_available():
            self.skipTest("no GPU")
        n = torch.cuda.device_count()
        with self.assertRaises(BadRequest) as cm:
            pick_device(f"cuda:{n}")
        self.assertIn(f"has {n} CUDA device(s)", str(cm.exception))

    def test_precision(self):
        cpu = torch.device("cpu")
        self.assertIsNone(check_precision("fp32", cpu))
        self.assertIs(check_precision("bf16", cpu), torch.bfloat16)
        with self.assertRaises(BadRequest) as cm:
            check_precision("fp16", cpu)
        self.assertIn("workload.precision 'fp16' needs a CUDA device", str(cm.exception))
        with self.assertRaises(BadRequest) as cm:
            check_precision("fp8", cpu)
        self.assertIn("workload.precision 'fp8'", str(cm.exception))

    def test_session_refuses_before_building(self):
        with self.assertRaises(BadRequest):
            Session(TINY, {}, device="cpu", precision="fp16")


class CPUPrecisionTest(unittest.TestCase):
    def test_bf16_autocast_trains_on_cpu(self):
        with tempfile.TemporaryDirectory() as d:
            prepare.prepare(CHARLM, LM_CFG, d)
            shards = sorted(glob.glob(os.path.join(d, "shard-*.txt")))
            s = Session(CHARLM, LM_CFG, device="cpu", precision="bf16")
            info = s.info()
            self.assertEqual((info["device"], info["precision"]), ("cpu", "bf16"))
            self.assertGreater(info["device_memory_bytes"], 0)
            with s._autocast():
                self.assertEqual(torch.nn.functional.linear(torch.ones(2, 4), torch.ones(3, 4)).dtype, torch.bfloat16)
            r = s.train(None, shards, 40, 0, None, None, os.path.join(d, "o.st"))
            self.assertLess(r["loss_last"], r["loss_first"])
            # Parameters stay fp32: autocast changes the compute, not the packs.
            self.assertTrue(all(p.dtype == torch.float32 for p in s.model.parameters()))


@unittest.skipUnless(torch.cuda.is_available(), "no CUDA device (torch.cuda.is_available() is false)")
class CUDATest(unittest.TestCase):
    def test_tiny_lm_trains_on_cuda_in_every_precision(self):
        with tempfile.TemporaryDirectory() as d:
            prepare.prepare(CHARLM, LM_CFG, d)
            shards = sorted(glob.glob(os.path.join(d, "shard-*.txt")))
            for precision in ("fp32", "bf16", "fp16"):
                with self.subTest(precision=precision):
                    if precision == "bf16" and not torch.cuda.is_bf16_supported():
                        self.skipTest("this GPU has no bfloat16")
                    s = Session(CHARLM, LM_CFG, device="cuda:0", precision=precision, seed=1)
                    info = s.info()
                    self.assertEqual(info["device"], "cuda:0")
                    self.assertEqual(info["device_name"], torch.cuda.get_device_name(0))
                    self.assertGreater(info["device_memory_bytes"], 1 << 30)
                    with s._autocast():  # autocast is really on: a matmul computes in the chosen dtype
                        out = torch.nn.functional.linear(torch.ones(2, 4, device="cuda:0"), torch.ones(3, 4, device="cuda:0"))
                    self.assertEqual(out.dtype, {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[precision])
                    before = s.evaluate()["metrics"]["loss"]
                    r = s.train(None, shards, 60, 0, None, None, os.path.join(d, f"{precision}.st"))
                    after = s.evaluate()["metrics"]["loss"]
                    self.assertLess(after, before - 0.5, f"{precision}: held-out loss {before:.3f} -> {after:.3f}")
                    self.assertGreater(r["metrics"]["device_max_memory_allocated_bytes"], 0)
                    if precision == "fp16":
                        self.assertIn("grad_scale", r["metrics"])
                    print(f"\n  cuda {precision}: {info['device_name']}, held-out loss {before:.3f} -> {after:.3f}, "
                          f"{r['metrics']['samples_per_second']:.0f} samples/s, "
                          f"peak {r['metrics']['device_max_memory_allocated_bytes'] / 2**20:.1f} MiB")


if __name__ == "__main__":
    unittest.main()


class CUDAWarningTest(unittest.TestCase):
    """The worker warns when the machine has an NVIDIA GPU that torch cannot use."""

    def test_warns_only_for_an_unusable_gpu(self):
        from unittest import mock

        from p2ptrain import placement

        with mock.patch.object(placement, "nvidia_present", return_value=False):
            self.assertIsNone(placement.cuda_warning("cpu"))
        with mock.patch.object(placement, "nvidia_present", return_value=True), \
                mock.patch.object(torch.cuda, "is_available", return_value=False):
            w = placement.cuda_warning("cpu")
            self.assertIn("NVIDIA GPU", w)
            self.assertIn("CUDA build of torch", w)
            self.assertIn("workload.interpreter", w)
        with mock.patch.object(placement, "nvidia_present", return_value=True), \
                mock.patch.object(torch.cuda, "is_available", return_value=True):
            self.assertIsNone(placement.cuda_warning("cpu"))
