"""p2ptrain.command, run as the checkpoint-command backend runs it."""

import json
import os
import subprocess
import sys
import tempfile
import unittest

from p2ptrain import safetensors as st

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = "p2ptrain.testing:Tiny"


class CommandTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()

    def tearDown(self):
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp.name, name)

    def run_job(self, job, factory=TINY, extra=()):
        jp, rp = self.path(f"{job['job_id']}.json"), self.path(f"{job['job_id']}.result.json")
        with open(jp, "w") as f:
            json.dump(job, f)
        env = dict(os.environ, PYTHONPATH=ROOT, P2PTRAIN_JOB_MANIFEST=jp, P2PTRAIN_RESULT_MANIFEST=rp)
        p = subprocess.run(
            [sys.executable, "-m", "p2ptrain.command", "--factory", factory, "--threads", "1", *extra],
            env=env, capture_output=True, text=True, timeout=300,
        )
        result = None
        if os.path.exists(rp):
            with open(rp) as f:
                result = json.load(f)
        return p, result

    def job(self, kind, job_id, **kw):
        j = {"protocol_version": 1, "job_id": job_id, "kind": kind, "base_pack": None, "output_pack": None,
             "shard_paths": [], "steps": 0, "seed": 0, "optimizer_state_in": None, "optimizer_state_out": None,
             "include": [], "exclude": [], "config": {}, "device": "cpu"}
        j.update(kw)
        return j

    def test_init_train_evaluate(self):
        p, r = self.run_job(self.job("init", "init-1", output_pack=self.path("base.st"), seed=4))
        self.assertEqual(p.returncode, 0, p.stderr)
        with st.Pack(self.path("base.st")) as pk:
            self.assertEqual(pk.layout_hash, r["layout_hash"])
        p, r = self.run_job(self.job("train", "train-1", base_pack=self.path("base.st"), output_pack=self.path("out.st"),
                                     shard_paths=["x"], steps=20, seed=1, optimizer_state_out=self.path("opt.st")))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(r["steps_completed"], 20)
        self.assertEqual(r["samples"], 20 * 16)
        self.assertLess(r["loss_last"], r["loss_first"])
        p, r2 = self.run_job(self.job("train", "train-2", base_pack=self.path("out.st"), output_pack=self.path("out2.st"),
                                      shard_paths=["x"], steps=5, seed=2, optimizer_state_in=self.path("opt.st"),
                                      optimizer_state_out=self.path("opt2.st")))
        self.assertEqual(p.returncode, 0, p.stderr)
        p, r = self.run_job(self.job("evaluate", "evaluate-1", base_pack=self.path("out2.st")))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("mse", r["metrics"])

    def test_failure_writes_error_and_exits_nonzero(self):
        p, r = self.run_job(self.job("train", "train-9", output_pack=self.path("o.st"), shard_paths=["x"], steps=3,
                                     config={"fault": "nan"}), factory="p2ptrain.testing:Faulty")
        self.assertEqual(p.returncode, 1)
        self.assertEqual(r["error"]["type"], "NonFinite")
        self.assertTrue(p.stderr.strip().splitlines()[-1].startswith("p2ptrain.command: NonFinite:"))

    def test_bad_kind(self):
        p, r = self.run_job(self.job("dance", "dance-1"))
        self.assertEqual(p.returncode, 1)
        self.assertEqual(r["error"]["type"], "BadRequest")

    def test_check(self):
        ok = subprocess.run([sys.executable, "-m", "p2ptrain.command", "--factory", TINY, "--check"],
                            env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True)
        self.assertEqual(ok.returncode, 0, ok.stderr)
        bad = subprocess.run([sys.executable, "-m", "p2ptrain.command", "--factory", "nope_mod:X", "--check"],
                             env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True)
        self.assertEqual(bad.returncode, 1)
        self.assertIn("nope_mod", bad.stderr)


if __name__ == "__main__":
    unittest.main()
