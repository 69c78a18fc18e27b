"""A ready-made checkpoint command: runs one job of the checkpoint-command backend.

    python -m p2ptrain.command --factory module:attr [--config JSON] [--job PATH] [--result PATH]

The job manifest comes from ``--job`` or ``$P2PTRAIN_JOB_MANIFEST``; the result manifest is
written to ``--result`` or ``$P2PTRAIN_RESULT_MANIFEST`` (docs/worker-protocol.md,
"Checkpoint-command backend"). ``--config`` overrides the manifest's ``config``.
``--check`` only imports the factory and exits (the node uses it at start-up).

Exit status 0 means the result manifest holds the result. On failure the command writes
``{"error": {"type", "message", "traceback"}}`` to the result manifest when it can, prints
the error as its last stderr line, and exits 1 (2 for usage errors).
"""

import argparse
import json
import os
import sys
import traceback

from .errors import BadRequest, P2PTrainError

PROTOCOL_VERSION = 1


def _write_json(path, obj):
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(obj, f, allow_nan=False)
    os.replace(tmp, path)


def _field(job, key, types, required=True, default=None):
    v = job.get(key)
    if v is None:
        if required:
            raise BadRequest(f"job manifest: missing {key!r}")
        return default
    if not isinstance(v, types) or isinstance(v, bool) and types is int:
        raise BadRequest(f"job manifest: {key!r} has the wrong type {type(v).__name__}")
    return v


def run_job(job, factory, config=None, threads=0):
    """Run one job dict and return the result dict."""
    if job.get("protocol_version", PROTOCOL_VERSION) != PROTOCOL_VERSION:
        raise BadRequest(f"job manifest protocol_version {job.get('protocol_version')!r}, this command speaks {PROTOCOL_VERSION}")
    kind = _field(job, "kind", str)
    if kind not in ("init", "train", "evaluate"):
        raise BadRequest(f"job manifest: unknown kind {kind!r} (want init, train or evaluate)")
    if config is None:
        config = _field(job, "config", dict, required=False, default={})
    from .session import Session

    seed = _field(job, "seed", int, required=False, default=0)
    s = Session(
        factory,
        config,
        include=_field(job, "include", list, required=False, default=[]),
        exclude=_field(job, "exclude", list, required=False, default=[]),
        device=_field(job, "device", str, required=False, default="auto"),
        precision=_field(job, "precision", str, required=False, default="fp32"),
        threads=_field(job, "threads", int, required=False, default=threads) or threads,
        seed=seed,
    )
    if kind == "init":
        return s.init(seed, _field(job, "output_pack", str))
    if kind == "evaluate":
        return s.evaluate(_field(job, "base_pack", str))
    steps = _field(job, "steps", int)
    r = s.train(
        base=_field(job, "base_pack", str, required=False),
        shards=_field(job, "shard_paths", list),
        steps=steps,
        seed=seed,
        opt_in=_field(job, "optimizer_state_in", str, required=False),
        opt_out=_field(job, "optimizer_state_out", str, required=False),
        out=_field(job, "output_pack", str),
    )
    r["steps_completed"] = r.pop("steps")
    return r


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m p2ptrain.command", description="Run one p2ptrain checkpoint-command job.")
    ap.add_argument("--factory", required=True, help="workload factory, module:attr")
    ap.add_argument("--config", help="workload config as JSON (overrides the job manifest's config)")
    ap.add_argument("--job", help="job manifest path (default $P2PTRAIN_JOB_MANIFEST)")
    ap.add_argument("--result", help="result manifest path (default $P2PTRAIN_RESULT_MANIFEST)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--check", action="store_true", help="only check that the factory imports")
    args = ap.parse_args(argv)

    config = None
    if args.config is not None:
        try:
            config = json.loads(args.config)
        except ValueError as e:
            ap.error(f"--config is not JSON: {e}")
        if not isinstance(config, dict):
            ap.error("--config must be a JSON object")
    if args.check:
        from . import workload

        try:
            workload.resolve(args.factory)
        except P2PTrainError as e:
            print(f"p2ptrain.command: {e.type}: {e}", file=sys.stderr)
            return 1
        return 0

    job_path = args.job or os.environ.get("P2PTRAIN_JOB_MANIFEST")
    result_path = args.result or os.environ.get("P2PTRAIN_RESULT_MANIFEST")
    if not job_path or not result_path:
        ap.error("need --job/--result or P2PTRAIN_JOB_MANIFEST/P2PTRAIN_RESULT_MANIFEST")
    try:
        with open(job_path) as f:
            job = json.load(f)
        if not isinstance(job, dict):
            raise BadRequest(f"job manifest {job_path} is not a JSON object")
        result = run_job(job, args.factory, config, args.threads)
        _write_json(result_path, result)
        return 0
    except Exception as e:
        etype = e.type if isinstance(e, P2PTrainError) else "Internal"
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
        sys.stderr.write(tb)
        try:
            _write_json(result_path, {"error": {"type": etype, "message": str(e), "traceback": tb}})
        except Exception:
            pass
        print(f"p2ptrain.command: {etype}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
