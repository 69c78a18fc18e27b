"""Print a workload's model config as JSON.

    python -m p2ptrain.modelconfig --factory module:attr [--config JSON] [--out FILE]

Constructs the workload (no model is built, no data read) and prints what its optional
``model_config()`` method returns: a JSON object with the hyperparameters needed to rebuild
the model (``p2pnode export`` writes it as ``config.json`` beside the safetensors), or
``null`` when the workload has no such method. With ``--out`` the JSON goes to FILE
(written atomically) instead of stdout, which user code may print on.
"""

import argparse
import json
import os
import sys

from . import workload
from .errors import P2PTrainError, WorkloadError


def model_config(factory, config):
    w = workload.build(factory, config)
    fn = getattr(w, "model_config", None)
    if fn is None:
        return None
    try:
        cfg = fn()
    except Exception as e:
        raise WorkloadError(f"model_config() raised {type(e).__name__}: {e}") from e
    if cfg is None:
        return None
    if not isinstance(cfg, dict) or not all(isinstance(k, str) for k in cfg):
        raise WorkloadError(f"model_config() must return a dict with string keys or None, got {type(cfg).__name__}")
    try:
        json.dumps(cfg, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise WorkloadError(f"model_config() is not plain JSON: {e}") from None
    return cfg


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m p2ptrain.modelconfig", description="Print a workload's model config as JSON.")
    ap.add_argument("--factory", required=True, help="workload factory, module:attr")
    ap.add_argument("--config", default="{}", help="workload config as JSON")
    ap.add_argument("--out", help="write the JSON to this file instead of stdout")
    args = ap.parse_args(argv)
    try:
        config = json.loads(args.config)
    except ValueError as e:
        ap.error(f"--config is not JSON: {e}")
    if not isinstance(config, dict):
        ap.error("--config must be a JSON object")
    try:
        cfg = model_config(args.factory, config)
    except P2PTrainError as e:
        print(f"p2ptrain.modelconfig: {e.type}: {e}", file=sys.stderr)
        return 1
    text = json.dumps(cfg, sort_keys=True, indent=2) + "\n"
    if args.out:
        tmp = f"{args.out}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, args.out)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
