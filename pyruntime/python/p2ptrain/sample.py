"""Generate text from an exported language model.

    python3 -m p2ptrain.sample --model DIR --prompt TEXT --tokens N --seed S
                               [--temperature 0.8] [--top-k 40]

DIR is what ``p2pnode export`` wrote for a ``p2ptrain.workloads.lm`` experiment:
``config.json`` (the model's hyperparameters) and ``model.safetensors`` (or the shards
``model-NNNNN-of-NNNNN.safetensors`` named by ``model.safetensors.index.json``). Nothing
else is read: no node, no store, no dataset. The model is rebuilt from config.json, every
tensor's name and shape is checked against it, and N bytes are sampled after the prompt
(which must fit in the model's context); the prompt and the continuation are written to
stdout as raw bytes. The same seed gives the same text.
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

from . import safetensors
from .errors import BadRequest, LayoutMismatch, P2PTrainError, SafetensorsError
from .workloads import lm

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


def read_config(model_dir):
    """The model config of DIR (errors name the file and the field)."""
    path = os.path.join(model_dir, CONFIG_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
    except FileNotFoundError:
        raise BadRequest(f"{path}: no config.json in the model directory (export it with `p2pnode export` from an lm experiment)") from None
    except (OSError, ValueError) as e:
        raise BadRequest(f"{path}: cannot read: {e}") from None
    if not isinstance(cfg, dict):
        raise BadRequest(f"{path}: must hold a JSON object")
    if cfg.get("model_type") != lm.MODEL_TYPE:
        raise BadRequest(f"{path}: model_type is {cfg.get('model_type')!r}, this sampler reads {lm.MODEL_TYPE!r}")
    if cfg.get("vocab_size", lm.VOCAB) != lm.VOCAB:
        raise BadRequest(f"{path}: vocab_size {cfg.get('vocab_size')!r}, the byte-level model has {lm.VOCAB}")
    for k in lm.MODEL_KEYS:
        v = cfg.get(k)
        if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
            raise BadRequest(f"{path}: field {k!r} is {v!r}, want a positive integer")
    if cfg["width"] % cfg["heads"]:
        raise BadRequest(f"{path}: width {cfg['width']} is not a multiple of heads {cfg['heads']}")
    return cfg


def weight_files(model_dir):
    """{tensor name: file path} of the exported safetensors."""
    index = os.path.join(model_dir, INDEX_FILE)
    single = os.path.join(model_dir, SINGLE_FILE)
    if os.path.exists(index):
        try:
            with open(index, encoding="utf-8") as f:
                wm = json.load(f)["weight_map"]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise BadRequest(f"{index}: no readable weight_map: {e}") from None
        if not isinstance(wm, dict) or not all(isinstance(v, str) and os.path.basename(v) == v for v in wm.values()):
            raise BadRequest(f"{index}: weight_map must map tensor names to file names in the directory")
        return {name: os.path.join(model_dir, fn) for name, fn in wm.items()}
    if os.path.exists(single):
        with safetensors.File(single) as f:
            return {name: single for name in f.names()}
    raise BadRequest(f"{model_dir}: neither {SINGLE_FILE} nor {INDEX_FILE} is there")


def load_model(model_dir):
    """Rebuild the model from DIR's config.json and load its safetensors, checking shapes."""
    cfg = read_config(model_dir)
    model = lm.build_transformer(*(cfg[k] for k in lm.MODEL_KEYS))
    sd = model.state_dict()
    files = weight_files(model_dir)
    cfg_path = os.path.join(model_dir, CONFIG_FILE)
    missing = sorted(set(sd) - set(files))
    if missing:
        raise LayoutMismatch(f"{cfg_path} describes a model with tensors that {model_dir} lacks: {missing[:5]}")
    extra = sorted(set(files) - set(sd))
    if extra:
        raise LayoutMismatch(f"{model_dir} holds tensors that the model of {cfg_path} has not: {extra[:5]}")
    opened = {}
    try:
        for path in sorted(set(files.values())):
            opened[path] = safetensors.File(path)
        # Check every shape before copying anything.
        for name, t in sd.items():
            info = opened[files[name]].info(name)
            if tuple(info.shape) != tuple(t.shape) or info.dtype not in ("F32", "F16", "BF16"):
                raise LayoutMismatch(
                    f"{files[name]}: tensor {name!r} is {info.dtype}{list(info.shape)}, but {cfg_path} "
                    f"(layers {cfg['layers']}, width {cfg['width']}, context {cfg['context']}) needs F32{list(t.shape)}"
                )
        with torch.no_grad():
            for name, t in sd.items():
                f = opened[files[name]]
                a = f.array(name)
                if f.info(name).dtype == "BF16":
                    src = torch.from_numpy(np.array(a, copy=True).view(np.int16)).view(torch.bfloat16)
                else:
                    src = torch.from_numpy(np.array(a, copy=True))
                t.copy_(src.to(torch.float32))
    finally:
        for f in opened.values():
            f.close()
    model.eval()
    return model, cfg


@torch.no_grad()
def generate(model, prompt, tokens, seed, temperature=0.8, top_k=40):
    """``tokens`` bytes sampled after ``prompt`` (bytes); the same seed gives the same bytes."""
    ctx = model.context
    if len(prompt) > ctx:
        raise BadRequest(f"--prompt: {len(prompt)} bytes is longer than the model's context ({ctx} bytes)")
    if tokens < 0:
        raise BadRequest(f"--tokens: {tokens} is negative")
    if temperature < 0:
        raise BadRequest(f"--temperature: {temperature} is negative")
    gen = torch.Generator().manual_seed(int(seed))
    # An empty prompt starts from a newline, the most common byte at a line's start.
    seq = list(prompt) or [ord("\n")]
    out = []
    for _ in range(tokens):
        idx = torch.tensor([seq[-ctx:]], dtype=torch.int64)
        logits = model(idx)[0, -1].float()
        if temperature == 0:
            nxt = int(logits.argmax())
        else:
            logits = logits / temperature
            if top_k and top_k < logits.numel():
                kth = torch.topk(logits, top_k).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = int(torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=gen))
        seq.append(nxt)
        out.append(nxt)
    return bytes(out)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python3 -m p2ptrain.sample", description="Generate text from an exported p2ptrain LM.")
    ap.add_argument("--model", required=True, help="exported model directory (config.json + safetensors)")
    ap.add_argument("--prompt", default="", help="text to continue (UTF-8; at most the model's context in bytes)")
    ap.add_argument("--tokens", type=int, default=200, help="bytes to generate")
    ap.add_argument("--seed", type=int, default=0, help="sampling seed: the same seed gives the same text")
    ap.add_argument("--temperature", type=float, default=0.8, help="softmax temperature (0: greedy)")
    ap.add_argument("--top-k", type=int, default=40, help="sample among the k likeliest bytes (0: all)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    args = ap.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        model, _ = load_model(args.model)
        text = generate(model, args.prompt.encode("utf-8"), args.tokens, args.seed, args.temperature, args.top_k)
    except (P2PTrainError, SafetensorsError) as e:
        print(f"p2ptrain.sample: {e}", file=sys.stderr)
        return 2
    out = sys.stdout.buffer
    out.write(args.prompt.encode("utf-8") + text)
    out.write(b"\n")
    out.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
