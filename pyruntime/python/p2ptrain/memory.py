"""Memory options: activation checkpointing per block, and a process's peak memory.

``workload.activation_checkpointing: true`` wraps the forward of every module the workload's
``blocks(model)`` names in ``torch.utils.checkpoint`` (non-reentrant, so it works under DDP
and FSDP2): a block keeps its input for the backward pass instead of every activation inside
it, and runs its forward again during the backward pass. The forward is replaced on the
instance, so the model's state-dict names (and so its packs) do not change.
"""

import resource

import torch
import torch.utils.checkpoint as torch_checkpoint


def checkpoint_blocks(blocks):
    """Make each block recompute its activations in the backward pass."""
    for block in blocks:
        if getattr(block, "_p2ptrain_checkpointed", False):
            continue
        block.forward = _checkpointed(block.forward)
        block._p2ptrain_checkpointed = True


def _checkpointed(forward):
    def run(*args, **kwargs):
        if not torch.is_grad_enabled():  # evaluation: nothing to save, nothing to recompute
            return forward(*args, **kwargs)
        return torch_checkpoint.checkpoint(forward, *args, use_reentrant=False, **kwargs)

    return run


def peak_rss_bytes():
    """This process's peak resident set size (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
