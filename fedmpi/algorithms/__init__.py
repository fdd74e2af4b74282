"""One small file per algorithm family (the loader, ``fedmpi.plugins.load``, imports them all)."""

from .base import Algorithm, AlgorithmParams, Context, ServerAlgorithm, Snapshot, register  # noqa: F401
