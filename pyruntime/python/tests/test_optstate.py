import os
import tempfile
import unittest

import torch
from torch import nn

from p2ptrain import optstate, safetensors as st
from p2ptrain.errors import LayoutMismatch

torch.set_num_threads(1)


def setup(seed=0, opt_cls=torch.optim.AdamW, **kw):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 1))
    return m, opt_cls(m.parameters(), **kw)


def step(m, opt, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(8, 3, generator=g)
    opt.zero_grad()
    ((m(x) - x.sum(1, keepdim=True)) ** 2).mean().backward()
    opt.step()


class OptStateTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.tmp.name, "opt.safetensors")

    def tearDown(self):
        self.tmp.cleanup()

    def check_round_trip(self, opt_cls, **kw):
        m, opt = setup(opt_cls=opt_cls, **kw)
        for s in range(3):
            step(m, opt, s)
        optstate.save(opt, self.path)
        # A fresh model+optimizer with the same parameters and loaded state continues exactly.
        m2, opt2 = setup(seed=1, opt_cls=opt_cls, **kw)
        m2.load_state_dict(m.state_dict())
        optstate.load(opt2, self.path)
        step(m, opt, 10)
        step(m2, opt2, 10)
        for a, b in zip(m.parameters(), m2.parameters()):
            self.assertTrue(torch.equal(a, b))
        sd1, sd2 = opt.state_dict(), opt2.state_dict()
        self.assertEqual(sd1["param_groups"][0]["lr"], sd2["param_groups"][0]["lr"])

    def test_adamw_round_trip(self):
        self.check_round_trip(torch.optim.AdamW, lr=1e-2, betas=(0.8, 0.95))

    def test_sgd_momentum_round_trip(self):
        self.check_round_trip(torch.optim.SGD, lr=0.1, momentum=0.9, nesterov=True)

    def test_file_is_safetensors_not_pickle(self):
        m, opt = setup()
        step(m, opt, 0)
        optstate.save(opt, self.path)
        with st.File(self.path) as f:
            self.assertEqual(f.metadata["format"], optstate.FORMAT)
            self.assertEqual(f.metadata["optimizer"], "AdamW")
            self.assertIn("state.0.exp_avg", f.names())
            self.assertIn("state.3.exp_avg_sq", f.names())
        with open(self.path, "rb") as fh:
            self.assertNotIn(b"\x80\x04", fh.read(2))  # no pickle protocol marker

    def test_refuses_other_model(self):
        m, opt = setup()
        step(m, opt, 0)
        optstate.save(opt, self.path)
        other = nn.Linear(3, 2)
        with self.assertRaises(LayoutMismatch):
            optstate.load(torch.optim.AdamW(other.parameters()), self.path)
        m2, _ = setup()
        with self.assertRaises(LayoutMismatch):
            optstate.load(torch.optim.SGD(m2.parameters(), lr=0.1), self.path)


if __name__ == "__main__":
    unittest.main()
