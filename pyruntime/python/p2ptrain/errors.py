"""Errors that cross the worker protocol.

Each class carries the protocol's error ``type`` (docs/worker-protocol.md); the worker turns
any other exception into ``WorkloadError`` (raised inside user code) or ``Internal`` (a bug
in p2ptrain).
"""


class P2PTrainError(Exception):
    """Base class; ``type`` is the protocol's error type."""

    type = "Internal"


class BadRequest(P2PTrainError):
    type = "BadRequest"


class WorkloadError(P2PTrainError):
    type = "WorkloadError"


class LayoutMismatch(P2PTrainError):
    type = "LayoutMismatch"


class NonFinite(P2PTrainError):
    type = "NonFinite"


class RankFailed(P2PTrainError):
    """A rank of a multi-device worker exited or stopped answering: the call failed and
    every rank was restarted."""

    type = "RankFailed"


class Internal(P2PTrainError):
    type = "Internal"


class SafetensorsError(P2PTrainError, ValueError):
    """Bytes that are not valid safetensors (or not a canonical pack)."""

    type = "BadRequest"
