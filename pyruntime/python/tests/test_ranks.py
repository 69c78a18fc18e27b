"""Ranks inside one worker (p2ptrain.ranks): gloo on this machine's CPUs, one torch thread a
rank. FSDP needs torch >= 2.4 and is refused here (Debian's torch is 1.13); its path runs on
the GPU machine (scripts/ranks-gpu.sh)."""

import os
import shutil
import tempfile
import time
import unittest

import numpy as np
import torch

from p2ptrain import placement
from p2ptrain import safetensors as st
from p2ptrain.errors import BadRequest, NonFinite, RankFailed
from p2ptrain.ranks import Ranks
from p2ptrain.session import Session
from p2ptrain.workloads.lm import LM

LM_F = "p2ptrain.workloads.lm:LM"
TINY = "p2ptrain.testing:Tiny"
FAULTY = "p2ptrain.testing:Faulty"
RECORDER = "p2ptrain.testing:Recorder"
# The lm's tiny preset cut so that a CPU step takes milliseconds.
LM_CFG = {"preset": "tiny", "context": 32, "batch_size": 4, "corpus_bytes": 400000, "shard_bytes": 16384,
          "eval_bytes": 2048, "warmup": 2}


def max_abs_diff(a, b):
    with st.Pack(a) as pa, st.Pack(b) as pb:
        assert pa.names() == pb.names()
        return max(float(np.abs(pa.array(n) - pb.array(n)).max()) for n in pa.names())


def read_lines(path):
    with open(path) as f:
        return f.read().splitlines()


class LMData(unittest.TestCase):
    """A directory with the cut lm's shard files (two of them in ``shards``), and per-test
    paths in it."""

    @classmethod
    def setUpClass(cls):
        torch.set_num_threads(1)
        cls.dir = tempfile.mkdtemp(prefix="p2ptrain-ranks-")
        data = os.path.join(cls.dir, "data")
        os.makedirs(data)
        LM.prepare_dataset(LM_CFG, data)
        cls.shards = sorted(os.path.join(data, f) for f in os.listdir(data) if f.endswith(".txt"))[:2]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.dir, f"{self.id().rsplit('.', 1)[-1]}-{name}")


class RanksTest(LMData):

    def ranks(self, factory, config, n=2, **kw):
        r = Ranks(["cpu"] * n, factory, config, threads=1, seed=1, **kw)
        self.addCleanup(r.close)
        return r

    def test_two_ranks_equal_one_rank_at_twice_the_batch(self):
        """The same samples, the same optimizer: a 2-rank window of batch 4 a rank is a
        1-rank window of batch 8, up to float rounding (the mean of two means)."""
        base = self.path("base")
        one = Session(LM_F, dict(LM_CFG, batch_size=8), device="cpu", seed=1, threads=1)
        one.init(1, base)
        job = dict(base=base, shards=self.shards, steps=6, seed=5)
        r1 = one.train(**job, out=self.path("one"), opt_out=self.path("opt-one"))
        # A second window from the first's optimizer state: the state goes in and out alike.
        r1b = one.train(**dict(job, seed=6), opt_in=self.path("opt-one"), out=self.path("one-b"))
        two = self.ranks(LM_F, LM_CFG)
        r2 = two.train(**job, out=self.path("two"), opt_out=self.path("opt-two"), opt_in=None, shift=None)
        r2b = two.train(**dict(job, seed=6), opt_in=self.path("opt-two"), opt_out=None, out=self.path("two-b"), shift=None)
        d1 = max_abs_diff(self.path("one"), self.path("two"))
        d2 = max_abs_diff(self.path("one-b"), self.path("two-b"))
        print(f"\n2 ranks x batch 4 vs 1 rank x batch 8, lm tiny: max abs difference {d1:.3g} after 6 steps, {d2:.3g} after 12")
        self.assertLess(d1, 1e-4)
        self.assertLess(d2, 1e-4)
        self.assertEqual(r2["samples"], r1["samples"])
        self.assertEqual(r2["samples"], 6 * 8)
        self.assertAlmostEqual(r2["loss"], r1["loss"], places=5)
        self.assertAlmostEqual(r2b["loss_last"], r1b["loss_last"], places=4)
        self.assertEqual(r2["idle_ranks"], 0)
        self.assertEqual([r["rank"] for r in r2["ranks"]], [0, 1])
        info = two.info()
        self.assertEqual(info["ranks"], 2)
        self.assertEqual([d["rank"] for d in info["devices"]], [0, 1])
        self.assertTrue(all(d["device"] == "cpu" and d["pid"] > 0 for d in info["devices"]))

    def test_batches_split_disjoint_in_stream_order(self):
        rec1, rec2 = self.path("rec1"), self.path("rec2")
        os.makedirs(rec1)
        os.makedirs(rec2)
        one = Session(RECORDER, {"record_dir": rec1, "batch_size": 16}, device="cpu", seed=1, threads=1)
        one.train(base=None, shards=["x"], steps=12, seed=9, out=self.path("one"))
        stream = read_lines(os.path.join(rec1, "rank0.txt"))
        two = self.ranks(RECORDER, {"record_dir": rec2, "batch_size": 16})
        r = two.train(base=None, shards=["x"], steps=6, seed=9, out=self.path("two"), opt_in=None, opt_out=None, shift=None)
        got = [read_lines(os.path.join(rec2, f"rank{i}.txt")) for i in range(2)]
        self.assertEqual(got[0], stream[0::2])
        self.assertEqual(got[1], stream[1::2])
        self.assertEqual(r["samples"], 12 * 16)

    def test_fewer_batches_than_ranks_trains_on_the_rest(self):
        """One batch a pass and two ranks: rank 0 trains the stream alone (rank 1 steps with
        its loss weighted 0), so the update is the one-rank update."""
        cfg = {"batch_size": 256}
        one = Session(TINY, cfg, device="cpu", seed=1, threads=1)
        base = self.path("base")
        one.init(1, base)
        one.train(base=base, shards=["x"], steps=5, seed=3, out=self.path("one"))
        two = self.ranks(TINY, cfg)
        r = two.train(base=base, shards=["x"], steps=5, seed=3, out=self.path("two"), opt_in=None, opt_out=None, shift=None)
        self.assertEqual(r["idle_ranks"], 1)
        self.assertEqual(r["samples"], 5 * 256)
        self.assertLess(max_abs_diff(self.path("one"), self.path("two")), 1e-6)

    def test_shift_moves_every_rank_before_one_step(self):
        base, target = self.path("base"), self.path("target")
        one = Session(LM_F, dict(LM_CFG, batch_size=8), device="cpu", seed=1, threads=1)
        one.init(1, base)
        one.init(2, target)
        shift = self.path("shift.json")

        def ask():
            with open(shift + ".tmp", "w") as f:
                f.write('{"to": "%s"}' % target)
            os.replace(shift + ".tmp", shift)

        # The ranks see a request that is there before step 0 and move before step 1; the
        # one-rank reference gets it after its first step.
        one.progress = lambda done: ask() if done == 1 else None
        r1 = one.train(base=base, shards=self.shards, steps=4, seed=5, out=self.path("one"), shift=shift)
        self.assertEqual(r1["shifted_at"], 1)
        two = self.ranks(LM_F, LM_CFG)
        ask()
        r2 = two.train(base=base, shards=self.shards, steps=4, seed=5, out=self.path("two"), shift=shift, opt_in=None, opt_out=None)
        self.assertEqual((r2["shifted_at"], r2["shifted_to"]), (1, target))
        self.assertFalse(os.path.exists(shift))
        self.assertLess(max_abs_diff(self.path("one"), self.path("two")), 1e-4)

    def test_rank_that_exits_fails_the_window_and_the_ranks_restart(self):
        once = self.path("once")
        cfg = {"fault": "exit", "at_step": 3, "rank": 1, "once_file": once}
        two = self.ranks(FAULTY, cfg)
        pids = [d["pid"] for d in two.info()["devices"]]
        job = dict(base=None, shards=["x"], steps=5, seed=3, opt_in=None, opt_out=None, shift=None)
        with self.assertRaises(RankFailed) as e:
            two.train(**job, out=self.path("bad"))
        self.assertIn("rank 1 (cpu", str(e.exception))
        self.assertIn("exit status 3", str(e.exception))
        self.assertFalse(os.path.exists(self.path("bad")))
        r = two.train(**job, out=self.path("good"))
        self.assertEqual(r["steps"], 5)
        self.assertEqual(two.restarts, 1)
        self.assertNotEqual([d["pid"] for d in two.info()["devices"]], pids)

    def test_rank_killed_between_windows_is_replaced_without_failing_one(self):
        two = self.ranks(TINY, {})
        os.kill(two.info()["devices"][1]["pid"], 9)
        time.sleep(0.5)
        # The largest seed a node sends (an int64): rank 1 seeds its own RNG from it too.
        r = two.train(base=None, shards=["x"], steps=3, seed=(1 << 63) - 1, out=self.path("out"), opt_in=None, opt_out=None, shift=None)
        self.assertEqual(r["steps"], 3)
        self.assertEqual(two.restarts, 1)

    def test_rank_that_hangs_fails_the_window_within_the_rank_timeout(self):
        once = self.path("once")
        cfg = {"fault": "hang", "at_step": 2, "rank": 1, "once_file": once, "hang_seconds": 600}
        two = self.ranks(FAULTY, cfg, timeout=3)
        job = dict(base=None, shards=["x"], steps=5, seed=3, opt_in=None, opt_out=None, shift=None)
        t0 = time.monotonic()
        with self.assertRaises(RankFailed) as e:
            two.train(**job, out=self.path("bad"))
        took = time.monotonic() - t0
        self.assertIn("rank 1 (cpu", str(e.exception))
        self.assertLess(took, 3 + two.grace + 15)
        r = two.train(**job, out=self.path("good"))
        self.assertEqual(r["steps"], 5)

    def test_loss_not_finite_on_one_rank_stops_every_rank_alike(self):
        two = self.ranks(FAULTY, {"fault": "nan", "at_step": 2, "rank": 1})
        with self.assertRaises(Exception) as e:
            two.train(base=None, shards=["x"], steps=4, seed=3, out=self.path("bad"), opt_in=None, opt_out=None, shift=None)
        self.assertEqual(e.exception.type, NonFinite.type, str(e.exception))
        self.assertIn("at step 2 of 4", str(e.exception))
        self.assertEqual(two.restarts, 0, "the ranks stayed in step: no restart")

    def test_probe_counts_every_rank(self):
        two = self.ranks(TINY, {})
        p = two.probe(["x"], 3)
        self.assertGreater(p["samples_per_second"], 0)
        self.assertGreater(p["seconds_per_step"], 0)

    def test_evaluate_and_export_from_rank_zero(self):
        two = self.ranks(LM_F, LM_CFG)
        base = self.path("base")
        two.init(4, base)
        one = Session(LM_F, LM_CFG, device="cpu", seed=1, threads=1)
        self.assertEqual(two.evaluate(base)["metrics"], one.evaluate(base)["metrics"])
        two.export(self.path("export"))
        self.assertEqual(max_abs_diff(base, self.path("export")), 0.0)


GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0


@unittest.skipUnless(GPUS >= 1, "needs a CUDA GPU (scripts/ranks-gpu.sh runs these on the GPU machine)")
class CUDATest(LMData):
    """NCCL ranks and FSDP2 on GPUs: skipped where torch sees none (here), run by
    scripts/ranks-gpu.sh where it does."""

    def test_devices_all_on_one_gpu_is_that_gpu(self):
        on = placement.plan(devices="all")
        self.assertEqual(len(on), GPUS)
        s = Session(LM_F, LM_CFG, device=str(on[0]), seed=1, activation_checkpointing=True, precision="bf16")
        r = s.train(base=None, shards=self.shards, steps=4, seed=2, out=self.path("out"))
        self.assertGreater(r["metrics"]["device_max_memory_allocated_bytes"], 0)

    @unittest.skipUnless(GPUS >= 2, "needs two GPUs")
    def test_nccl_two_ranks_equal_one_gpu_at_twice_the_batch(self):
        base = self.path("base")
        one = Session(LM_F, dict(LM_CFG, batch_size=8), device="cuda:0", seed=1)
        one.init(1, base)
        job = dict(base=base, shards=self.shards, steps=6, seed=5)
        one.train(**job, out=self.path("one"))
        two = Ranks(["cuda:0", "cuda:1"], LM_F, LM_CFG, seed=1)
        self.addCleanup(two.close)
        r = two.train(**job, out=self.path("two"), opt_out=self.path("opt-two"), opt_in=None, shift=None)
        d = max_abs_diff(self.path("one"), self.path("two"))
        print(f"\nNCCL 2 GPUs x batch 4 vs 1 GPU x batch 8: max abs difference {d:.3g}")
        self.assertLess(d, 1e-3)
        self.assertEqual(len(r["ranks"]), 2)

    @unittest.skipUnless(GPUS >= 2, "needs two GPUs")
    def test_fsdp_trains_as_ddp_and_writes_whole_model_files(self):
        if placement.fully_shard_fn() is None:
            self.skipTest(f"torch {torch.__version__} has no FSDP2")
        base = self.path("base")
        Session(LM_F, LM_CFG, device="cuda:0", seed=1).init(1, base)
        job = dict(base=base, shards=self.shards, steps=6, seed=5, shift=None)
        outs = {}
        for shard in ("ddp", "fsdp"):
            r = Ranks(["cuda:0", "cuda:1"], LM_F, LM_CFG, seed=1, shard=shard)
            self.addCleanup(r.close)
            r.train(**job, out=self.path(shard), opt_in=None, opt_out=self.path(f"opt-{shard}"))
            # A second window from the first's optimizer state (FSDP loads its shard of it).
            r.train(**dict(job, seed=6), out=self.path(f"{shard}-b"), opt_in=self.path(f"opt-{shard}"), opt_out=None)
            outs[shard] = r
        d1 = max_abs_diff(self.path("ddp"), self.path("fsdp"))
        d2 = max_abs_diff(self.path("ddp-b"), self.path("fsdp-b"))
        print(f"\nFSDP2 vs DDP on 2 GPUs: max abs difference {d1:.3g} after 6 steps, {d2:.3g} after 12")
        self.assertLess(d1, 1e-3)
        self.assertLess(d2, 1e-3)
        # The optimizer state FSDP gathered is the file a one-device worker reads: one GPU at
        # twice the batch goes on from it as the FSDP ranks did.
        one = Session(LM_F, dict(LM_CFG, batch_size=8), device="cuda:0", seed=1)
        one.train(**dict(job, seed=6), out=self.path("one-b"), opt_in=self.path("opt-fsdp"))
        self.assertLess(max_abs_diff(self.path("one-b"), self.path("fsdp-b")), 1e-3)


class PlacementTest(unittest.TestCase):
    def test_bad_settings_are_refused_naming_the_field(self):
        cases = [
            (dict(devices=["cuda:0", "cuda:0"]), "workload.devices[1] 'cuda:0' names the same GPU as workload.devices[0]"),
            (dict(devices=["cuda:1", "cuda"]), "workload.devices[1] 'cuda': name each GPU by its index"),
            (dict(devices=["cpu", "cuda:0"]), "mixes cpu and cuda"),
            (dict(devices=["cpu", "cpu"]), "workload.devices lists cpu"),
            (dict(devices=["gpu0"]), "workload.devices[0] 'gpu0' is not a device torch knows"),
            (dict(devices=["cuda:0", "cuda:1"], device="cuda:0"), "workload.devices and workload.device"),
            (dict(devices=["cuda:0", "cuda:1"], ranks=2), "workload.ranks and workload.devices are both set"),
            (dict(ranks=2, device="cuda:0"), "workload.ranks 2 runs ranks on the CPU"),
            (dict(ranks=-1), "workload.ranks must be"),
            (dict(device="cpu", shard="fsdp"), "workload.shard fsdp needs at least two ranks"),
            (dict(device="cpu", ranks=1, shard="fsdp"), "workload.shard fsdp needs at least two ranks"),
            (dict(device="cpu", ranks=2, shard="zero3"), "workload.shard 'zero3' is not one of ddp, fsdp"),
        ]
        if not torch.cuda.is_available():
            cases += [
                (dict(devices=["cuda:0", "cuda:1"]), "torch.cuda.is_available() is false"),
                (dict(devices="all"), "workload.devices all: torch sees no CUDA device"),
            ]
        for kw, want in cases:
            with self.subTest(**{k: str(v) for k, v in kw.items()}):
                with self.assertRaises(BadRequest) as e:
                    placement.plan(**kw)
                self.assertIn(want, str(e.exception))

    def test_fsdp_on_an_older_torch_is_refused_with_the_version(self):
        if placement.fully_shard_fn() is not None:
            self.skipTest(f"torch {torch.__version__} has FSDP2")
        with self.assertRaises(BadRequest) as e:
            placement.plan(device="cpu", ranks=2, shard="fsdp")
        self.assertIn(f"workload.shard fsdp needs torch >= 2.4 (FSDP2 fully_shard); this worker's torch is {torch.__version__}", str(e.exception))

    def test_cpu_ranks_and_single_devices(self):
        self.assertEqual(placement.plan(device="cpu", ranks=2), [torch.device("cpu")] * 2)
        self.assertIsNone(placement.plan(device="cpu", ranks=1))
        self.assertIsNone(placement.plan(device="cpu"))
        if not torch.cuda.is_available():
            self.assertEqual(placement.plan(device="auto", ranks=3), [torch.device("cpu")] * 3)

    def test_torch_version(self):
        self.assertEqual(placement.torch_version("1.13.0a0+gitabc"), (1, 13))
        self.assertEqual(placement.torch_version("2.11.0+cu130"), (2, 11))
        self.assertEqual(placement.torch_version("2.4"), (2, 4))


class ActivationCheckpointingTest(LMData):
    def test_same_update_with_and_without(self):
        base = self.path("base")
        outs = []
        for ac in (False, True):
            s = Session(LM_F, LM_CFG, device="cpu", seed=1, threads=1, activation_checkpointing=ac)
            if not ac:
                s.init(1, base)
            out = self.path(f"out-{ac}")
            s.train(base=base, shards=self.shards[:1], steps=4, seed=2, out=out)
            outs.append(out)
        self.assertEqual(max_abs_diff(*outs), 0.0)

    def test_refused_for_a_workload_without_blocks(self):
        with self.assertRaises(BadRequest) as e:
            Session(TINY, {}, device="cpu", activation_checkpointing=True)
        self.assertIn("workload.activation_checkpointing: workload 'p2ptrain.testing:Tiny' has no blocks(model) method", str(e.exception))


if __name__ == "__main__":
    unittest.main()
