"""Write a workload's dataset shards.

    python -m p2ptrain.prepare --factory module:attr [--config JSON] --out DIR

Calls the workload's ``prepare_dataset(config, out_dir)`` classmethod, which writes shard
files (and optionally an ``examples.json`` sidecar mapping file name -> example count) into
DIR. ``p2pnode dataset build`` then hashes the files into a dataset manifest.
"""

import argparse
import json
import os
import sys

from . import workload
from .errors import P2PTrainError, WorkloadError


def prepare(factory, config, out_dir):
    obj = workload.resolve(factory)
    fn = getattr(obj, "prepare_dataset", None)
    if fn is None:
        fn = getattr(workload.build(factory, config), "prepare_dataset", None)
    if fn is None:
        raise WorkloadError(f"workload {factory!r} has no prepare_dataset(config, out_dir)")
    os.makedirs(out_dir, exist_ok=True)
    try:
        fn(dict(config or {}), out_dir)
    except NotImplementedError as e:
        raise WorkloadError(str(e) or f"workload {factory!r} does not implement prepare_dataset") from None
    except P2PTrainError:
        raise
    except Exception as e:
        raise WorkloadError(f"prepare_dataset() raised {type(e).__name__}: {e}") from e
    return sorted(n for n in os.listdir(out_dir) if not n.startswith("."))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m p2ptrain.prepare", description="Write a workload's dataset shard files.")
    ap.add_argument("--factory", required=True, help="workload factory, module:attr")
    ap.add_argument("--config", default="{}", help="workload config as JSON")
    ap.add_argument("--out", required=True, help="output directory")
    args = ap.parse_args(argv)
    try:
        config = json.loads(args.config)
    except ValueError as e:
        ap.error(f"--config is not JSON: {e}")
    if not isinstance(config, dict):
        ap.error("--config must be a JSON object")
    try:
        files = prepare(args.factory, config, args.out)
    except P2PTrainError as e:
        if e.__cause__ is not None:
            import traceback

            traceback.print_exception(type(e.__cause__), e.__cause__, e.__cause__.__traceback__, file=sys.stderr)
        print(f"p2ptrain.prepare: {e.type}: {e}", file=sys.stderr)
        return 1
    print(f"wrote {len(files)} files to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
