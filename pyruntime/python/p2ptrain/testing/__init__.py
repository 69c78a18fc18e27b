"""Workloads for tests: a tiny fast model, and one that fails on purpose.

- ``p2ptrain.testing:Tiny``   linear regression on fixed synthetic data (no dataset files needed;
  shard paths are accepted and ignored)
- ``p2ptrain.testing:Faulty`` Tiny plus one injected fault, chosen by config:
    ``fault``: ``"nan"`` (loss becomes NaN), ``"exit"`` (``os._exit(exit_code)``), ``"hang"``
    (sleeps ``hang_seconds``), ``"raise"`` (raises RuntimeError), ``"print"`` (writes to stdout
    and stderr, which must not disturb the protocol), ``"write"`` (writes ``write_text`` to
    ``write_path``, by rename: a file the node drops mid-loop, such as a shift request)
    ``where``: ``"train"`` (default, in ``loss`` at step ``at_step``, default 1),
    ``"evaluate"``, ``"construct"`` (in ``__init__``)
    ``once_file``: when set, the fault fires only if this file does not exist yet, and
    creates it — so a restarted worker runs clean.
    ``arm_file``: when set, the fault fires only while this file exists.
    ``at_step`` counts ``loss`` calls since the workload was built.
    ``rank``: when set, the fault fires only on that rank of a multi-rank worker.
- ``p2ptrain.testing:Recorder`` Tiny that appends the sample indices of every batch it trains
  to ``record_dir``/rank<R>.txt (which rank trained which batches)
- ``p2ptrain.testing:PacedLM`` the lm workload with every step taking at least
  ``step_seconds``: trainers of equal speed on a loaded machine
"""

from .faults import Faulty, Recorder, Tiny
from .paced import PacedLM

__all__ = ["Tiny", "Faulty", "Recorder", "PacedLM"]
