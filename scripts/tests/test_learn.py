"""Tests of scripts/learn.py's parsing and tables (no swarm is run).

    /usr/bin/python3 -m unittest discover -s scripts/tests
"""

import argparse
import importlib.util
import io
import os
import unittest

_spec = importlib.util.spec_from_file_location("learn", os.path.join(os.path.dirname(__file__), "..", "learn.py"))
learn = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(learn)


class ParseTest(unittest.TestCase):
    def test_validator_progress_line(self):
        line = ("round   8/12  train-loss 2.4846  held-out accuracy  38.7%  held-out bits_per_byte 3.7076  "
                "held-out loss 2.5699  merged 2  14.6s  head bafireid…2fvjjm")
        m = learn.ROUND.match(line)
        self.assertEqual((m.group(1), m.group(2)), ("8", "2.5699"))
        self.assertIsNone(learn.ROUND.match("demo: 2 trainers started; logs in /x/*.log"))

    def test_reference_lines(self):
        m = learn.REF.match("seed 3 one node round 11: loss 2.3012")
        self.assertEqual(m.groups(), ("3", "one node", "11", "2.3012"))
        m = learn.REF.match("seed 1 outer lr 1, momentum 0.5, Nesterov round 2: loss 3.9000")
        self.assertEqual(m.groups(), ("1", "outer lr 1, momentum 0.5, Nesterov", "2", "3.9000"))


class ReportTest(unittest.TestCase):
    def setUp(self):
        self.a = argparse.Namespace(rounds=6, preset="tiny", trainers=2)
        self.runs = {
            "fp32": {1: [4.0, 3.0, 2.8, 2.7, 2.6, 2.5], 2: [4.2, 3.2, 3.0, 2.9, 2.8, 2.7]},
            "sparse": {1: [5.0, 4.0, 3.0, 2.8, 3.0, 2.6], 2: [5.0, 4.0, 3.0, 2.9, 2.8, 2.7]},
            learn.REFERENCE: {1: [4.0, 3.0, 2.8, 2.7, 2.6, 2.5], 2: [4.0, 3.0, 2.8, 2.7, 2.6, 2.5]},
            learn.ONE_NODE: {1: [3.5, 2.8, 2.6, 2.5, 2.4, 2.3], 2: [3.5, 2.8, 2.6, 2.5, 2.4, 2.3]},
        }

    def test_means_gaps_and_rises(self):
        out = io.StringIO()
        means = learn.report(self.a, self.runs, [1, 2], out)
        text = out.getvalue()
        self.assertAlmostEqual(means["fp32"][0], 4.1)
        self.assertAlmostEqual(means["sparse"][4], 2.9)
        # round 1: sparse 5.0 over fp32 4.1 is +22.0 %; fp32 4.1 over the reference 4.0 is +2.5 %
        row1 = next(l for l in text.splitlines() if l.startswith("| 1 |"))
        self.assertIn("+22.0 %", row1)
        self.assertIn("+2.5 %", row1)
        # the last third is rounds 5-6: fp32 seed 1 (2.6 + 2.5) / 2
        self.assertIn("Mean over rounds 5-6", text)
        self.assertIn("| fp32 | 2.5500 | 2.7500 | 2.6500 |", text)
        # sparse seed 1 rose 2.8 -> 3.0 at round 5: +7.1 %; rounds 1-3 do not count
        self.assertIn("| sparse | +7.1 % (round 5) | -3.3 % (round 4) |", text)
        self.assertIn("| run | seed 1 | seed 2 | mean | / reference | / one node | / fp32 |\n|---|---|---|---|---|---|---|\n", text)

    def test_sparse_rows_are_set_beside_the_sparse_reference(self):
        self.runs[learn.REFERENCE_SPARSE] = {1: [4.5, 3.5, 3.0, 2.8, 2.7, 2.6], 2: [5.5, 4.5, 3.0, 2.8, 2.7, 2.6]}
        text = io.StringIO()
        learn.report(self.a, self.runs, [1, 2], text)
        lines = text.getvalue().splitlines()
        header = next(l for l in lines if l.startswith("| round |"))
        self.assertIn("| sparse / reference DiLoCo sparse |", header)
        self.assertIn("| fp32 / reference DiLoCo |", header)
        self.assertNotIn("reference DiLoCo sparse / one node", header)
        # round 1: sparse 5.0 against the sparse reference's 5.0
        self.assertIn("| 1 | 4.1000 | 5.0000 | 4.0000 | 3.5000 | 5.0000 | +2.5 % | +0.0 % |", text.getvalue())

    def test_fewer_than_three_rounds(self):
        a = argparse.Namespace(rounds=2, preset="tiny", trainers=2)
        runs = {n: {1: v[1][:2]} for n, v in self.runs.items()}
        text = io.StringIO()
        learn.report(a, runs, [1], text)
        self.assertIn("Mean over rounds 2-2", text.getvalue())
        self.assertIn("| fp32 | 3.0000 | 3.0000 |", text.getvalue())
        self.assertIn("| fp32 | - |", text.getvalue())

    def test_plot_is_written(self):
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            self.skipTest("matplotlib does not import (python3-matplotlib)")
        import tempfile
        means = learn.report(self.a, self.runs, [1, 2], io.StringIO())
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "learn.png")
            self.assertEqual(learn.plot(self.a, means, path), f"plot: {path}")
            with open(path, "rb") as f:
                self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")


if __name__ == "__main__":
    unittest.main()
