"""PacedLM: the lm workload at a set pace (see p2ptrain.testing)."""

import time

from ..workloads.lm import LM


class PacedLM(LM):
    """``p2ptrain.workloads.lm:LM`` whose every inner step takes at least
    ``step_seconds`` (config; the rest of the config is the lm's): trainers and ranks of one
    speed on a machine whose load comes and goes, as equal GPUs would be."""

    def __init__(self, config):
        config = dict(config or {})
        self.step_seconds = float(config.pop("step_seconds", 0.0))
        super().__init__(config)
        self._last = None

    def loss(self, model, batch):
        if self._last is not None:
            time.sleep(max(0.0, self.step_seconds - (time.monotonic() - self._last)))
        self._last = time.monotonic()
        return super().loss(model, batch)
