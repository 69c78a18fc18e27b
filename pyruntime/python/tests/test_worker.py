"""The worker protocol over real pipes: the worker runs as a subprocess."""

import json
import os
import select
import struct
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

from p2ptrain import safetensors as st

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = "p2ptrain.testing:Tiny"
FAULTY = "p2ptrain.testing:Faulty"


class WorkerProcess:
    def __init__(self, tmpdir):
        req_r, self.req_w = os.pipe()
        self.resp_r, resp_w = os.pipe()
        self.out = open(os.path.join(tmpdir, "stdout"), "w+")
        self.err = open(os.path.join(tmpdir, "stderr"), "w+")
        env = dict(os.environ, PYTHONPATH=ROOT)
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-m", "p2ptrain.worker", "--fd-in", str(req_r), "--fd-out", str(resp_w)],
            pass_fds=(req_r, resp_w),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self.out,
            stderr=self.err,
        )
        os.close(req_r)
        os.close(resp_w)
        self.next_id = 0

    def send_raw(self, payload):
        os.write(self.req_w, struct.pack(">I", len(payload)) + payload)

    def recv(self, timeout=120):
        hdr = self._read(4, timeout)
        (n,) = struct.unpack(">I", hdr)
        return json.loads(self._read(n, timeout))

    def _read(self, n, timeout):
        buf = b""
        while len(buf) < n:
            r, _, _ = select.select([self.resp_r], [], [], timeout)
            if not r:
                raise TimeoutError("worker did not answer")
            b = os.read(self.resp_r, n - len(buf))
            if not b:
                raise EOFError(f"worker closed its output; stderr:\n{self.stderr()}")
            buf += b
        return buf

    def call(self, method, **params):
        self.next_id += 1
        self.send_raw(json.dumps({"id": self.next_id, "method": method, "params": params}).encode())
        resp = self.recv()
        assert resp["id"] == self.next_id, resp
        return resp

    def ok(self, method, **params):
        resp = self.call(method, **params)
        if not resp["ok"]:
            raise AssertionError(f"{method}: {resp['error']['type']}: {resp['error']['message']}\n{resp['error']['traceback']}")
        return resp["result"]

    def stderr(self):
        self.err.flush()
        self.err.seek(0)
        return self.err.read()

    def stdout(self):
        self.out.flush()
        self.out.seek(0)
        return self.out.read()

    def close(self):
        for fd in (self.req_w, self.resp_r):
            try:
                os.close(fd)
            except OSError:
                pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.out.close()
        self.err.close()


def alive(pid):
    """Whether a process runs (a zombie, exited but not yet reaped, does not count)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def hello(**kw):
    params = {"versions": [1], "factory": TINY, "config": {}, "include": [], "exclude": [], "device": "cpu", "threads": 1, "seed": 0}
    params.update(kw)
    return params


class WorkerProtocolTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.w = WorkerProcess(self.tmp.name)

    def tearDown(self):
        self.w.close()
        self.tmp.cleanup()

    def path(self, name):
        return os.path.join(self.tmp.name, name)

    def test_session(self):
        h = self.w.ok("hello", **hello())
        self.assertEqual(h["protocol_version"], 1)
        for cap in ("init", "load", "export", "train", "evaluate", "probe"):
            self.assertIn(cap, h["capabilities"])
        self.assertEqual(h["device"], "cpu")
        self.assertEqual(h["param_count"], 8 * 16 + 16 + 16 + 1)
        self.assertEqual(h["tokens_per_sample"], 0, "the test workload counts no tokens")

        r = self.w.ok("init", seed=5, out=self.path("base.st"))
        self.assertEqual(r["layout_hash"], h["layout_hash"])
        with st.Pack(self.path("base.st")) as p:
            self.assertEqual(p.layout_hash, h["layout_hash"])

        before = self.w.ok("evaluate", pack=self.path("base.st"))["metrics"]["mse"]
        r = self.w.ok(
            "train", base=self.path("base.st"), shards=["unused"], steps=40, seed=1, opt_in=None,
            opt_out=self.path("opt.st"), out=self.path("out.st"),
        )
        self.assertEqual(r["steps"], 40)
        self.assertEqual(r["samples"], 40 * 16)
        for k in ("loss", "loss_first", "loss_last", "seconds", "metrics"):
            self.assertIn(k, r)
        after = self.w.ok("evaluate", pack=self.path("out.st"))["metrics"]["mse"]
        self.assertLess(after, before)

        r2 = self.w.ok(
            "train", base=self.path("out.st"), shards=["unused"], steps=5, seed=2, opt_in=self.path("opt.st"),
            opt_out=self.path("opt2.st"), out=self.path("out2.st"),
        )
        self.assertEqual(r2["steps"], 5)

        self.w.ok("load", pack=self.path("out.st"))
        self.w.ok("export", out=self.path("exp.st"))
        with open(self.path("out.st"), "rb") as a, open(self.path("exp.st"), "rb") as b:
            self.assertEqual(a.read(), b.read())

        probe = self.w.ok("probe", shards=["x"], steps=3)
        self.assertGreater(probe["samples_per_second"], 0)
        self.assertGreater(probe["seconds_per_step"], 0)

        self.assertEqual(self.w.ok("shutdown"), {})
        self.assertEqual(self.w.proc.wait(timeout=30), 0)

    def test_ranks_behind_one_worker(self):
        """hello with ranks: 2 starts two rank processes; the worker answers for both, and
        when the node goes away they go too."""
        h = self.w.ok("hello", **hello(ranks=2, rank_timeout=30))
        self.assertIn("ranks", h["capabilities"])
        self.assertEqual(h["ranks"], 2)
        pids = [d["pid"] for d in h["devices"]]
        self.assertEqual([d["device"] for d in h["devices"]], ["cpu", "cpu"])
        r = self.w.ok("train", base=None, shards=["unused"], steps=4, seed=1, opt_in=None, opt_out=None, out=self.path("out.st"))
        self.assertEqual(r["samples"], 4 * 2 * 16)
        self.assertEqual([x["rank"] for x in r["ranks"]], [0, 1])
        self.assertTrue(all(x["peak_rss_bytes"] > 0 for x in r["ranks"]))
        self.w.close()
        deadline = time.monotonic() + 10
        while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        self.assertFalse([pid for pid in pids if alive(pid)], "rank processes outlived their worker")

    def test_ranks_refused_naming_the_field(self):
        from p2ptrain import placement

        if placement.fully_shard_fn() is not None:
            self.skipTest("this torch has FSDP2: shard fsdp is not refused")
        resp = self.w.call("hello", **hello(ranks=2, shard="fsdp"))
        self.assertFalse(resp["ok"])
        self.assertEqual(resp["error"]["type"], "BadRequest")
        self.assertIn("workload.shard fsdp", resp["error"]["message"])

    def test_train_shift(self):
        """A shift request moves the model onto another pack before the next step, once."""
        base, head, shift = self.path("base.st"), self.path("head.st"), self.path("shift.json")
        request = json.dumps({"to": head})
        self.w.ok("hello", **hello(factory="p2ptrain.testing:Faulty",
                                   config={"fault": "write", "at_step": 3, "write_path": shift, "write_text": request}))
        self.w.ok("init", seed=5, out=base)
        self.w.ok("init", seed=6, out=head)

        def train(start, out, shift=None):
            return self.w.ok("train", base=start, shards=["unused"], steps=6, seed=1, opt_in=None, opt_out=None,
                             out=self.path(out), shift=shift)

        # Written by the loop's third loss call: applied before step index 3.
        r = train(base, "mid.st", shift)
        self.assertEqual((r["shifted_at"], r["shifted_to"]), (3, head))
        self.assertFalse(os.path.exists(shift))
        with st.Pack(self.path("mid.st")) as m, st.Pack(head) as h, st.Pack(base) as b:
            for n in m.names():
                near_head = np.abs(m.array(n) - h.array(n)).max()
                self.assertLess(near_head, np.abs(m.array(n) - b.array(n)).max(), n)

        # There before the first step: the loop trains as one started from the head.
        with open(shift, "w") as f:
            f.write(request)
        r = train(base, "moved.st", shift)
        self.assertEqual((r["shifted_at"], r["shifted_to"]), (0, head))
        ref = train(head, "ref.st")
        self.assertEqual((ref["shifted_at"], ref["shifted_to"]), (-1, None))
        with st.Pack(self.path("moved.st")) as m, st.Pack(self.path("ref.st")) as want:
            for n in m.names():
                np.testing.assert_allclose(m.array(n), want.array(n), atol=1e-5, err_msg=n)

        # None: not moved. A request that is not one: BadRequest naming it.
        r = train(base, "none.st", shift)
        self.assertEqual((r["shifted_at"], r["shifted_to"]), (-1, None))
        with open(shift, "w") as f:
            f.write("{not json")
        r = self.w.call("train", base=base, shards=["x"], steps=2, seed=1, out=self.path("bad.st"), shift=shift)
        self.assertEqual(r["error"]["type"], "BadRequest")
        self.assertIn("shift request", r["error"]["message"])
        r = self.w.call("train", base=None, shards=["x"], steps=2, seed=1, out=self.path("bad.st"), shift=shift)
        self.assertEqual(r["error"]["type"], "BadRequest")

    def test_errors(self):
        r = self.w.call("train", steps=1)
        self.assertEqual(r["error"]["type"], "BadRequest")
        self.assertIn("hello first", r["error"]["message"])
        self.w.ok("hello", **hello())
        r = self.w.call("hello", **hello())
        self.assertEqual(r["error"]["type"], "BadRequest")
        r = self.w.call("fly")
        self.assertEqual((r["error"]["type"], r["error"]["message"]), ("BadRequest", "unknown method 'fly'"))
        r = self.w.call("init", seed="seven", out="x")
        self.assertEqual(r["error"]["type"], "BadRequest")
        self.assertIn("'seed' must be an integer", r["error"]["message"])
        r = self.w.call("train", steps=3, shards=[], out=self.path("o"))
        self.assertEqual(r["error"]["type"], "BadRequest")
        r = self.w.call("load", pack=self.path("missing.st"))
        self.assertEqual(r["error"]["type"], "BadRequest")
        with open(self.path("junk.st"), "wb") as f:
            f.write(b"\xff" * 64)
        r = self.w.call("load", pack=self.path("junk.st"))
        self.assertEqual(r["error"]["type"], "BadRequest")
        self.assertIn("header length", r["error"]["message"])
        st.write_pack(self.path("other.st"), [("w", np.zeros(3, np.float32))])
        r = self.w.call("load", pack=self.path("other.st"))
        self.assertEqual(r["error"]["type"], "LayoutMismatch")
        # Malformed JSON gets an answer with a null id, and the worker keeps serving.
        self.w.send_raw(b"{not json")
        r = self.w.recv()
        self.assertEqual((r["id"], r["ok"], r["error"]["type"]), (None, False, "BadRequest"))
        self.w.ok("init", seed=1, out=self.path("b.st"))

    def test_bad_factory(self):
        r = self.w.call("hello", **hello(factory="no_such_module_q:W"))
        self.assertEqual(r["error"]["type"], "WorkloadError")
        self.assertIn("no_such_module_q", r["error"]["message"])
        self.assertIn("ModuleNotFoundError", r["error"]["traceback"])

    def test_version_refused(self):
        r = self.w.call("hello", **hello(versions=[2, 3]))
        self.assertEqual(r["error"]["type"], "BadRequest")
        self.assertIn("no common protocol version", r["error"]["message"])

    def test_nonfinite_loss(self):
        self.w.ok("hello", **hello(factory=FAULTY, config={"fault": "nan", "at_step": 3}))
        r = self.w.call("train", base=None, shards=["x"], steps=5, seed=0, out=self.path("o.st"))
        self.assertEqual(r["error"]["type"], "NonFinite")
        self.assertIn("step 3", r["error"]["message"])
        self.assertFalse(os.path.exists(self.path("o.st")))

    def test_user_output_does_not_disturb_frames(self):
        self.w.ok("hello", **hello(factory=FAULTY, config={"fault": "print"}))
        self.w.ok("train", base=None, shards=["x"], steps=2, seed=0, out=self.path("o.st"))
        self.assertIn("a line on stdout", self.w.stdout())
        self.assertIn("a line on stderr", self.w.stderr())

    def test_workload_error_keeps_traceback(self):
        self.w.ok("hello", **hello(factory=FAULTY, config={"fault": "raise"}))
        r = self.w.call("train", base=None, shards=["x"], steps=2, seed=0, out=self.path("o.st"))
        self.assertEqual(r["error"]["type"], "WorkloadError")
        self.assertIn("loss() raised RuntimeError", r["error"]["message"])
        self.assertIn("faults.py", r["error"]["traceback"])

    def test_end_of_input_exits_cleanly(self):
        os.close(self.w.req_w)
        self.assertEqual(self.w.proc.wait(timeout=30), 0)

    def test_oversized_frame(self):
        os.write(self.w.req_w, struct.pack(">I", (16 << 20) + 1))
        r = self.w.recv()
        self.assertEqual(r["error"]["type"], "BadRequest")
        self.assertEqual(self.w.proc.wait(timeout=30), 1)


if __name__ == "__main__":
    unittest.main()
