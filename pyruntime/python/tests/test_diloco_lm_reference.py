import contextlib
import copy
import io
import unittest

import torch

from p2ptrain.tools import diloco_lm_reference as ref
from p2ptrain.tools.diloco_reference import Outer, Plan, window_share
from p2ptrain.workloads import lm

torch.set_num_threads(1)

# A transformer small enough for a unit test: a step takes milliseconds.
MINI = {"preset": "tiny", "layers": 1, "width": 32, "heads": 2, "context": 32, "batch_size": 4,
        "corpus_bytes": 300_000, "shard_bytes": 8192, "eval_bytes": 2048, "warmup": 2, "decay_steps": 40}
MINI_FLAGS = "layers=1,width=32,heads=2,context=32,batch_size=4,corpus_bytes=300000,shard_bytes=8192,eval_bytes=2048,warmup=2"


class LMReferenceTest(unittest.TestCase):
    def setUp(self):
        self.w = lm.LM(dict(MINI))
        self.w.device = "cpu"
        self.blocks, _ = self.w.split()
        torch.manual_seed(4)
        self.init = copy.deepcopy(self.w.build_model().state_dict())

    def test_one_worker_outer_lr1_is_plain_training(self):
        got = ref.run(self.w, self.blocks, self.init, 1, 6, Outer(1.0), 5, 3, 2, "cpu")
        # Plain training: one model and one optimizer, never reloaded, on the same plan.
        examples = sum(len(b) // self.w.context for b in self.blocks)
        plan = Plan(len(self.blocks), 1, window_share(6, 4, len(self.blocks), examples, 1, 2), 6, 5)
        wk = ref.Worker(self.w, self.init, "cpu")
        for r in range(1, 4):
            (s, steps), = plan.next_round()
            data = torch.frombuffer(bytearray(b"".join(self.blocks[i] for i in s)), dtype=torch.uint8).long()
            wk.train(wk.model, data, steps, 5 * 1_000_003 + r * 1009)
            wk.model.eval()
            with torch.no_grad():
                want = self.w.evaluate(wk.model)
            self.assertAlmostEqual(got[r - 1]["loss"], want["loss"], places=4, msg=f"round {r}")
        # The schedule went on across rounds: 18 steps of the one optimizer.
        self.assertEqual(wk.opt.steps_taken(), 18)

    def test_diloco_learns_and_is_deterministic(self):
        o = Outer(1.0, 0.5, False)
        a = ref.run(self.w, self.blocks, self.init, 3, 8, o, 2, 3, 2, "cpu")
        b = ref.run(self.w, self.blocks, self.init, 3, 8, o, 2, 3, 2, "cpu")
        self.assertEqual(a, b)
        self.assertLess(a[-1]["loss"], a[0]["loss"])

    def test_main_prints_tables_and_summary(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            ref.main(["--config", MINI_FLAGS, "--seeds", "1", "--rounds", "2", "--h", "3", "--bf16",
                      "--outer", "1.0:0.5:plain", "--outer", "1.0:0.5:nesterov"])
        text = out.getvalue()
        self.assertIn("### seed 1, outer lr 1, momentum 0.5, Nesterov", text)
        self.assertIn("| 2 |", text)
        self.assertIn("| outer lr 1, momentum 0.5 | 1 |", text)

    def test_swarm_config_changes_only_the_diloco_workers(self):
        def lines(*more):
            out = io.StringIO()
            with contextlib.redirect_stdout(out):
                ref.main(["--config", MINI_FLAGS, "--rounds", "2", "--h", "3", *more])
            text = out.getvalue().splitlines()
            return text[0], [l for l in text if " one node round " in l], [l for l in text if " outer lr " in l and " round " in l]

        head, base, dl = lines()
        head2, base2, dl2 = lines("--swarm-config", "lr=0.05,warmup=1")
        self.assertNotIn("DiLoCo workers", head)
        self.assertIn("DiLoCo workers: {'lr': 0.05, 'warmup': 1}", head2)
        self.assertEqual(base, base2)  # the one node trains as before
        self.assertEqual(len(dl), 2)
        self.assertNotEqual(dl, dl2)

    def test_bad_config_is_refused(self):
        with self.assertRaisesRegex(ValueError, "workload.config.widht"):
            ref.main(["--config", "widht=32", "--rounds", "1"])
        with self.assertRaisesRegex(ValueError, "workload.config.l_r"):
            ref.main(["--config", MINI_FLAGS, "--swarm-config", "l_r=0.1", "--rounds", "1"])


if __name__ == "__main__":
    unittest.main()
