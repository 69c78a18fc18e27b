import contextlib
import copy
import io
import unittest

import torch
from torch import nn

from p2ptrain.tools import diloco_reference as ref
from p2ptrain.workloads import digits

torch.set_num_threads(1)


def linear(values):
    m = nn.Linear(len(values), 1, bias=False)
    with torch.no_grad():
        m.weight.copy_(torch.tensor([values]))
    return m


class OuterStepTest(unittest.TestCase):
    def test_lr1_momentum0_is_the_local_model(self):
        g = linear([0.5, -1.0, 2.0])
        local = linear([0.25, 3.0, -1.5])
        opt = torch.optim.SGD(g.parameters(), lr=1.0, momentum=0.0)
        ref.outer_step(g, opt, [local], [240])
        self.assertTrue(torch.allclose(g.weight, local.weight, atol=1e-7), (g.weight, local.weight))

    def test_weighted_mean_and_nesterov_momentum_by_hand(self):
        for name, mu, nesterov in [("nesterov", 0.9, True), ("heavy ball", 0.5, False), ("no momentum", 0.0, False)]:
            with self.subTest(name):
                theta = torch.tensor([1.0, -2.0])
                g = linear(theta.tolist())
                opt = torch.optim.SGD(g.parameters(), lr=0.7, momentum=mu, nesterov=nesterov)
                m = torch.zeros(2)
                rounds = [
                    ([[0.5, -1.0], [2.0, -2.5]], [240, 180]),
                    ([[0.0, 0.0], [1.0, 1.0]], [100, 300]),
                ]
                for locals_, weights in rounds:
                    ref.outer_step(g, opt, [linear(v) for v in locals_], weights)
                    # Hand-computed: the samples-weighted mean of global − local, then SGD.
                    grad = sum(w * (theta - torch.tensor(v)) for v, w in zip(locals_, weights)) / sum(weights)
                    m = mu * m + grad
                    u = grad + mu * m if nesterov else m
                    theta = theta - 0.7 * u
                    self.assertTrue(torch.allclose(g.weight[0], theta, atol=1e-6), (name, g.weight, theta))


class PlanTest(unittest.TestCase):
    def test_window_share_as_the_demo(self):
        # 23 microshards of 1438 examples: 20 steps of 12 read 4; one node's 60 read 12.
        self.assertEqual(ref.window_share(20, 12, 23, 1438, 3, 3), 4)
        self.assertEqual(ref.window_share(60, 12, 23, 1438, 1, 9), 12)
        # Too many workers for the epoch: the configured share stays (windows repeat).
        self.assertEqual(ref.window_share(20, 12, 23, 1438, 6, 3), 3)
        self.assertEqual(len(ref.microshards(1438, 64)), 23)
        self.assertEqual(ref.microshards(1438, 64)[-1], (1408, 1438))

    def test_epoch_rounds_and_tail_steps(self):
        for workers, share, h, want in [
            (3, 4, 20, [[(4, 20), (4, 20), (4, 20)], [(4, 20), (4, 20), (3, 15)]]),
            (1, 12, 60, [[(12, 60)], [(11, 55)]]),
            # 23 in rounds of 10: the last full round takes the leftover of 3 with it
            # (lease.AbsorbTail), its windows longer in proportion (lease.WindowSteps).
            (2, 5, 20, [[(5, 20), (5, 20)], [(7, 28), (6, 24)]]),
        ]:
            with self.subTest(workers=workers):
                p = ref.Plan(23, workers, share, h, seed=7)
                for epoch in range(2):
                    seen = []
                    for r in range(2):
                        got = p.next_round()
                        self.assertEqual([(len(s), n) for s, n in got], want[r], (epoch, r))
                        seen += [i for s, _ in got for i in s]
                    self.assertEqual(sorted(seen), list(range(23)), f"epoch {epoch} trains every microshard once")


class RunTest(unittest.TestCase):
    def setUp(self):
        self.w = digits.Digits({"hidden": 16, "batch_size": 8, "lr": 0.003})
        xtr, ytr, _, _ = digits.load_split()
        self.x, self.y = torch.from_numpy(xtr), torch.from_numpy(ytr)
        torch.manual_seed(3)
        self.init = copy.deepcopy(self.w.build_model().state_dict())

    def test_one_worker_outer_lr1_is_plain_training(self):
        got = ref.run(self.w, self.x, self.y, self.init, 1, 6, ref.Outer(1.0), 5, 3, 9, 64)
        # Plain training: one model and one AdamW, never reloaded, on the same plan.
        shards = ref.microshards(len(self.y), 64)
        plan = ref.Plan(len(shards), 1, ref.window_share(6, 8, len(shards), len(self.y), 1, 9), 6, 5)
        wk = ref.Worker(self.w, self.init)
        want = []
        for r in range(1, 4):
            (s, steps), = plan.next_round()
            rows = torch.cat([torch.arange(*shards[i]) for i in s])
            wk.train(wk.model, self.x[rows], self.y[rows], steps, 5 * 1_000_003 + r * 1009)
            wk.model.eval()
            with torch.no_grad():
                want.append(self.w.evaluate(wk.model))
        for r, (a, b) in enumerate(zip(got, want), 1):
            self.assertAlmostEqual(a["loss"], b["loss"], places=5, msg=f"round {r}")
            self.assertAlmostEqual(a["accuracy"], b["accuracy"], places=6, msg=f"round {r}")

    def test_worker_reshuffles_when_its_rows_run_out(self):
        wk = ref.Worker(self.w, self.init)
        rows = torch.arange(10)
        # 5 steps of 8 over 10 rows: 8, 2 (the pass's tail), 8, 2, 8.
        self.assertEqual(wk.train(wk.model, self.x[rows], self.y[rows], 5, 1), 28)

    def test_diloco_learns_and_is_deterministic(self):
        w = digits.Digits({"hidden": 16, "batch_size": 8, "lr": 0.01})
        o = ref.Outer(1.0, 0.5, True)
        a = ref.run(w, self.x, self.y, self.init, 3, 10, o, 2, 8, 3, 64)
        b = ref.run(w, self.x, self.y, self.init, 3, 10, o, 2, 8, 3, 64)
        self.assertEqual(a, b)
        self.assertLess(a[-1]["loss"], a[0]["loss"])
        # 240 steps of batch 8 in all: from chance (10 %) to about 77 %.
        self.assertGreater(a[-1]["accuracy"], 0.6)

    def test_main_prints_tables_and_summary(self):
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            ref.main(["--seeds", "1,2", "--rounds", "2", "--h", "3", "--hidden", "16", "--window", "1-2",
                      "--outer", "1.0:0.5:nesterov", "--outer", "0.7:0.9:nesterov"])
        text = out.getvalue()
        self.assertIn("### seed 2, outer lr 0.7, momentum 0.9, Nesterov", text)
        self.assertIn("| 2 |", text)
        self.assertIn("| outer lr 1, momentum 0.5, Nesterov | mean |", text)
        self.assertIn("| outer lr 0.7, momentum 0.9, Nesterov | mean |", text)

    def test_outer_lr_warm_up(self):
        o = ref.Outer.parse("1.2:0.5:plain:w4")
        self.assertEqual((o.lr, o.momentum, o.nesterov, o.warmup), (1.2, 0.5, False, 4))
        self.assertEqual([round(o.lr_at(r), 9) for r in range(1, 7)], [0.3, 0.6, 0.9, 1.2, 1.2, 1.2])
        self.assertEqual(ref.Outer.parse("1.0:0.5:nesterov").lr_at(1), 1.0)
        self.assertIn("lr warm-up 4 rounds", str(o))
        # Round 1 of a 2-round warm-up is the outer step at half the lr: the same model as
        # a one-round run at lr / 2 without a warm-up.
        w = digits.Digits({"hidden": 16, "batch_size": 8, "lr": 0.01})
        warm = ref.run(w, self.x, self.y, self.init, 2, 5, ref.Outer(1.0, 0.5, True, 2), 2, 1, 3, 64)
        half = ref.run(w, self.x, self.y, self.init, 2, 5, ref.Outer(0.5, 0.5, True), 2, 1, 3, 64)
        full = ref.run(w, self.x, self.y, self.init, 2, 5, ref.Outer(1.0, 0.5, True), 2, 1, 3, 64)
        self.assertEqual(warm, half)
        self.assertNotEqual(warm, full)

    def test_bad_outer_is_refused(self):
        for s in ["1.0", "1.0:1.0", "0:0.5", "1.0:0.5:sideways", "x:0.5", "1.0:0.5:plain:wx", "1.0:0.5:plain:4"]:
            with self.subTest(s), self.assertRaises(SystemExit), contextlib.redirect_stderr(io.StringIO()):
                ref.main(["--outer", s])


if __name__ == "__main__":
    unittest.main()
