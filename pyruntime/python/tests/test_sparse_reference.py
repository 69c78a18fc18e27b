import copy
import unittest
from unittest import mock

import torch

from p2ptrain.tools import diloco_lm_reference as ref
from p2ptrain.tools.diloco_reference import Outer
from p2ptrain.tools.sparse_reference import ErrorFeedback, encode_decode, warmup_topk
from p2ptrain.workloads import lm
from tests.test_diloco_lm_reference import MINI

torch.set_num_threads(1)


def mini_lm():
    """The mini lm workload, its data blocks and one initial state (seed 4)."""
    w = lm.LM(dict(MINI))
    w.device = "cpu"
    blocks, _ = w.split()
    torch.manual_seed(4)
    return w, blocks, copy.deepcopy(w.build_model().state_dict())


def moved_pair(seed, n_in, n_out):
    """A global Linear(n_in, n_out) and a worker's copy of it moved by unit noise."""
    torch.manual_seed(seed)
    g, w = torch.nn.Linear(n_in, n_out), torch.nn.Linear(n_in, n_out)
    w.load_state_dict(g.state_dict())
    with torch.no_grad():
        for p in w.parameters():
            p.add_(torch.randn_like(p))
    return g, w


class EncodeDecodeTest(unittest.TestCase):
    def test_two_levels_by_least_squares(self):
        # Top 3 of |x|: 3, 2, 0.5. Splitting after 2 ({3, 2} -> 2.5, {0.5} -> 0.5) has the
        # least squared error (0.5, against 1.125 after 1 and 3.17 after 3).
        x = torch.tensor([0.1, -3.0, 2.0, 0.5])
        self.assertEqual(encode_decode(x, block=4, k=3).tolist(), [0.0, -2.5, 2.5, 0.5])

    def test_every_block_keeps_k_at_two_magnitudes_with_the_signs(self):
        g = torch.Generator().manual_seed(1)
        x = torch.randn(10_000, generator=g)
        dec = encode_decode(x, block=4096, k=64)
        for lo, k in ((0, 64), (4096, 64), (8192, 64)):  # the last block has 1808 values
            b, xb = dec[lo : lo + 4096], x[lo : lo + 4096]
            kept = b != 0
            self.assertEqual(int(kept.sum()), k)
            self.assertLessEqual(len(set(b[kept].abs().tolist())), 2)
            self.assertTrue(torch.equal(torch.sign(b[kept]), torch.sign(xb[kept])))
            # the kept values are the largest magnitudes
            self.assertGreaterEqual(float(xb[kept].abs().min()), float(xb[~kept].abs().max()))

    def test_short_last_block_keeps_at_most_its_length(self):
        dec = encode_decode(torch.tensor([1.0, -2.0, 3.0, 4.0, 5.0]), block=4, k=3)
        self.assertEqual(int((dec[4:] != 0).sum()), 1)
        self.assertEqual(dec[4].item(), 5.0)

    def test_bad_settings(self):
        for kw in (dict(block=0), dict(k=0), dict(decay=0), dict(decay=1.5), dict(warmup=-1), dict(factor=0.5),
                   dict(factor=float("nan"))):
            with self.assertRaises(ValueError):
                ErrorFeedback(**kw)


class WarmupTest(unittest.TestCase):
    def test_the_nodes_warmup_topk(self):
        # What diloco.SparseWarmupTopK gives (diloco/sparse_test.go checks the same rule).
        cases = [
            ((64, 4096, 4, 16, r), k) for r, k in ((1, 1024), (2, 512), (3, 256), (4, 128), (5, 64), (100, 64))
        ] + [
            ((64, 4096, 0, 16, 1), 64),  # no warm-up rounds
            ((64, 4096, 4, 1, 1), 64),  # factor 1
            ((64, 4096, 4, 16, 0), 64),  # round 0
            ((64, 512, 4, 16, 1), 512),  # never more than the block
            ((2, 64, 1, 3, 1), 6),  # one round
            ((10, 4096, 2, 3, 2), 17),  # 10 × 3^0.5 = 17.3
            ((1, 4096, 2, 6.25, 2), 3),  # 1 × 6.25^0.5 = 2.5 rounds away from zero, as Go does
        ]
        for args, want in cases:
            with self.subTest(args=args):
                self.assertEqual(warmup_topk(*args), want)

    def test_a_warm_round_keeps_more_values(self):
        g, w = moved_pair(5, 64, 64)  # 4160 values: one block of 4096 and 64
        kept = []
        for r in (1, 5):
            ef = ErrorFeedback(block=4096, k=64, decay=1.0, warmup=4, factor=16)
            kept.append(int((ef.send(g, copy.deepcopy(w), r)[:4096] != 0).sum()))
        self.assertEqual(kept, [1024, 64])

    def test_the_reference_sends_each_window_with_its_rounds_topk(self):
        w, blocks, init = mini_lm()
        rounds = []
        send = ErrorFeedback.send

        def spy(self, global_model, model, round=0):
            rounds.append(round)
            return send(self, global_model, model, round)

        with mock.patch.object(ErrorFeedback, "send", spy):
            ref.run(w, blocks, init, 2, 4, Outer(1.0, 0.5, True), 5, 3, 2, "cpu",
                    sparse=dict(block=512, k=8, decay=0.95, warmup=2, factor=16))
        self.assertEqual(rounds, [1, 1, 2, 2, 3, 3])


class ErrorFeedbackTest(unittest.TestCase):
    def test_nothing_is_lost_only_delayed(self):
        g, w = moved_pair(3, 50, 40)
        names = sorted(n for n, _ in g.named_parameters())
        want = torch.cat([(dict(g.named_parameters())[n] - dict(w.named_parameters())[n]).reshape(-1) for n in names])
        ef = ErrorFeedback(block=256, k=8, decay=1.0)
        dec = ef.send(g, w)
        torch.testing.assert_close(dec + ef.residual, want.detach())
        # the worker's parameters now say global − decoded: what the outer step reads
        got = torch.cat([(dict(g.named_parameters())[n] - dict(w.named_parameters())[n]).reshape(-1) for n in names])
        torch.testing.assert_close(got.detach(), dec, atol=1e-6, rtol=0)
        self.assertLess(int((dec != 0).sum()), want.numel())

    def test_sparse_diloco_runs_and_differs_from_fp32(self):
        w, blocks, init = mini_lm()
        dense = ref.run(w, blocks, init, 2, 4, Outer(1.0, 0.5, True), 5, 2, 2, "cpu")
        sparse = ref.run(w, blocks, init, 2, 4, Outer(1.0, 0.5, True), 5, 2, 2, "cpu",
                         sparse=dict(block=512, k=8, decay=0.95))
        self.assertEqual(len(sparse), 2)
        self.assertNotEqual(dense[-1]["loss"], sparse[-1]["loss"])
        # round 1 sends 8 of every 512 values of a dense update: the slow start (issue 44)
        self.assertGreater(sparse[0]["loss"], dense[0]["loss"])


if __name__ == "__main__":
    unittest.main()
