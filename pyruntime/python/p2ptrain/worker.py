"""The worker process: ``python -m p2ptrain.worker --fd-in 3 --fd-out 4``.

Reads request frames on ``--fd-in`` and writes one response frame per request on
``--fd-out`` (docs/worker-protocol.md). A frame is a 4-byte big-endian length and that many
bytes of UTF-8 JSON, at most 16 MiB. stdout and stderr belong to user code; the worker never
writes frames there. End of input on ``--fd-in`` (the node went away) ends the worker.
"""

import argparse
import json
import os
import struct
import sys
import traceback

from .errors import BadRequest, Internal, P2PTrainError

PROTOCOL_VERSIONS = (1,)
MAX_FRAME = 16 << 20
CAPABILITIES = (
    "init",
    "load",
    "export",
    "train",
    "evaluate",
    "probe",
    "optimizer_state",
    "nonfinite_metrics_as_strings",
    "train_shift",
    "ranks",
    "activation_checkpointing",
)


class EndOfInput(Exception):
    pass


def read_exact(fd, n):
    chunks, got = [], 0
    while got < n:
        b = os.read(fd, min(n - got, 1 << 20))
        if not b:
            if got == 0 and not chunks:
                raise EndOfInput()
            raise EndOfInput(f"input ended inside a frame ({got} of {n} bytes)")
        chunks.append(b)
        got += len(b)
    return b"".join(chunks)


def read_frame(fd):
    (n,) = struct.unpack(">I", read_exact(fd, 4))
    if n > MAX_FRAME:
        raise BadRequest(f"request frame of {n} bytes exceeds the {MAX_FRAME}-byte limit")
    return read_exact(fd, n) if n else b""


def write_frame(fd, payload):
    if len(payload) > MAX_FRAME:
        raise Internal(f"response frame of {len(payload)} bytes exceeds the {MAX_FRAME}-byte limit")
    mv = memoryview(struct.pack(">I", len(payload)) + payload)
    while mv:
        k = os.write(fd, mv)
        mv = mv[k:]


def _encode(obj):
    return json.dumps(obj, separators=(",", ":"), allow_nan=False, ensure_ascii=False).encode("utf-8")


# ---- parameter checks ----------------------------------------------------------------------

def _get(params, key, types, what, required=True, default=None):
    if key not in params or params[key] is None:
        if required:
            raise BadRequest(f"missing parameter {key!r} ({what})")
        return default
    v = params[key]
    if isinstance(v, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        raise BadRequest(f"parameter {key!r} must be {what}, got bool")
    if not isinstance(v, types):
        raise BadRequest(f"parameter {key!r} must be {what}, got {type(v).__name__}")
    return v


def _str(params, key, required=True):
    return _get(params, key, str, "a string", required)


def _int(params, key, required=True, default=0):
    return _get(params, key, int, "an integer", required, default)


def _str_list(params, key, required=False):
    v = _get(params, key, list, "a list of strings", required, [])
    if not all(isinstance(s, str) for s in v):
        raise BadRequest(f"parameter {key!r} must be a list of strings")
    return v


class Worker:
    def __init__(self):
        self.session = None

    def close(self):
        """Stop the ranks of a multi-device session (a single-device one has none)."""
        close = getattr(self.session, "close", None)
        if close is not None:
            close()

    def dispatch(self, method, params):
        if not isinstance(params, dict):
            raise BadRequest("params must be a JSON object")
        if method == "hello":
            return self.hello(params)
        if method == "shutdown":
            return {}
        handler = getattr(self, "m_" + method, None) if isinstance(method, str) else None
        if handler is None:
            raise BadRequest(f"unknown method {method!r}")
        if self.session is None:
            raise BadRequest(f"{method} before hello: call hello first")
        return handler(params)

    def hello(self, params):
        if self.session is not None:
            raise BadRequest("hello was already called on this worker")
        versions = _get(params, "versions", list, "a list of protocol versions")
        common = [v for v in versions if isinstance(v, int) and v in PROTOCOL_VERSIONS]
        if not common:
            raise BadRequest(
                f"no common protocol version: the node speaks {versions}, this worker speaks {list(PROTOCOL_VERSIONS)}"
            )
        factory = _str(params, "factory")
        config = _get(params, "config", dict, "an object", required=False, default={})
        include, exclude = _str_list(params, "include"), _str_list(params, "exclude")
        device = _str(params, "device", required=False) or "auto"
        threads = _int(params, "threads", required=False)
        seed = _int(params, "seed", required=False)
        precision = _str(params, "precision", required=False) or "fp32"
        devices = params.get("devices")
        if devices is not None and devices != "all" and not (isinstance(devices, list) and all(isinstance(d, str) for d in devices)):
            raise BadRequest(f"parameter 'devices' must be 'all' or a list of device names, got {devices!r}")
        ranks = _int(params, "ranks", required=False)
        shard = _str(params, "shard", required=False) or "ddp"
        checkpointing = _get(params, "activation_checkpointing", bool, "a boolean", required=False, default=False)
        rank_timeout = _get(params, "rank_timeout", (int, float), "a number of seconds", required=False, default=120)
        if rank_timeout <= 0:
            raise BadRequest(f"workload.rank_timeout must be positive, got {rank_timeout}")
        try:
            import torch  # noqa: F401
        except Exception as e:
            from .errors import WorkloadError

            raise WorkloadError(f"torch is not importable by {sys.executable}: {type(e).__name__}: {e}") from e
        from . import placement

        on = placement.plan(device, devices, ranks, shard)
        if on is not None and len(on) > 1:
            from .ranks import Ranks

            self.session = Ranks([str(d) for d in on], factory, config, include, exclude, threads, seed, precision,
                                 shard=shard, activation_checkpointing=checkpointing, timeout=rank_timeout)
        else:
            from .session import Session

            if on is not None:
                device = str(on[0])
            self.session = Session(factory, config, include, exclude, device, threads, seed, precision,
                                   activation_checkpointing=checkpointing)
        result = {"protocol_version": max(common), "capabilities": list(CAPABILITIES)}
        result.update(self.session.info())
        warning = placement.cuda_warning(result.get("device", device))
        if warning:
            result["warnings"] = [warning]
        return result

    def m_probe(self, p):
        return self.session.probe(_str_list(p, "shards"), _int(p, "steps", required=False, default=5))

    def m_init(self, p):
        return self.session.init(_int(p, "seed"), _str(p, "out"))

    def m_load(self, p):
        return self.session.load(_str(p, "pack"))

    def m_export(self, p):
        return self.session.export(_str(p, "out"))

    def m_train(self, p):
        steps = _int(p, "steps")
        if steps < 0:
            raise BadRequest(f"steps must be >= 0, got {steps}")
        shards = _str_list(p, "shards")
        if steps > 0 and not shards:
            raise BadRequest("train needs at least one shard file")
        return self.session.train(
            base=_str(p, "base", required=False),
            shards=shards,
            steps=steps,
            seed=_int(p, "seed", required=False),
            opt_in=_str(p, "opt_in", required=False),
            opt_out=_str(p, "opt_out", required=False),
            out=_str(p, "out"),
            shift=_str(p, "shift", required=False),
        )

    def m_evaluate(self, p):
        return self.session.evaluate(_str(p, "pack", required=False))


def error_body(e):
    if isinstance(e, P2PTrainError):
        etype, msg = e.type, str(e)
    elif isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError)):
        etype, msg = "BadRequest", f"{type(e).__name__}: {e}"
    else:
        etype, msg = "Internal", f"{type(e).__name__}: {e}"
    tb = getattr(e, "remote_traceback", "") or "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return {"type": etype, "message": msg, "traceback": tb}


def serve(fd_in, fd_out):
    w = Worker()
    try:
        return _serve(w, fd_in, fd_out)
    finally:
        w.close()


def _serve(w, fd_in, fd_out):
    while True:
        req_id = None
        try:
            raw = read_frame(fd_in)
        except EndOfInput as e:
            if str(e):
                print(f"p2ptrain.worker: {e}", file=sys.stderr)
                return 1
            return 0
        except BadRequest as e:
            # We cannot resynchronise after an oversized frame: answer and stop.
            write_frame(fd_out, _encode({"id": None, "ok": False, "error": error_body(e)}))
            return 1
        method = None
        try:
            try:
                req = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError) as e:
                raise BadRequest(f"request is not UTF-8 JSON: {e}") from None
            if not isinstance(req, dict):
                raise BadRequest("request must be a JSON object")
            req_id = req.get("id")
            method = req.get("method")
            result = w.dispatch(method, req.get("params") or {})
            body = _encode({"id": req_id, "ok": True, "result": result})
            if len(body) > MAX_FRAME:
                raise Internal(f"{method} result of {len(body)} bytes exceeds the frame limit")
        except Exception as e:
            body = _encode({"id": req_id, "ok": False, "error": error_body(e)})
        write_frame(fd_out, body)
        if method == "shutdown":
            return 0


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m p2ptrain.worker", description=__doc__.splitlines()[0])
    ap.add_argument("--fd-in", type=int, required=True, help="file descriptor to read requests from")
    ap.add_argument("--fd-out", type=int, required=True, help="file descriptor to write responses to")
    args = ap.parse_args(argv)
    for fd in (args.fd_in, args.fd_out):
        try:
            os.set_inheritable(fd, False)  # user subprocesses must not hold our channel open
        except OSError as e:
            ap.error(f"file descriptor {fd}: {e}")
    try:
        return serve(args.fd_in, args.fd_out)
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
