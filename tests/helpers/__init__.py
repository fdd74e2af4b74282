"""Fixtures shared by several test files (``conftest`` runs the CLI; these build objects in-process):
``quadratic`` (the exact-gradient quadratic task, a scripted participation), ``baselines`` and
``curved`` (scenarios on it), ``images`` (a tiny image trainer with dropout)."""

from __future__ import annotations

import dataclasses

from fedmpi import plugins
from fedmpi.registry import AVAILABILITY


def availability_params(kind: str, lenient: bool = False, **keys):
    """The parameters of availability kind ``kind`` (its own dataclass) with ``keys``;
    ``lenient`` drops the keys the kind does not declare."""
    plugins.load()
    cls = AVAILABILITY.get(kind).params
    if lenient:
        keys = {k: v for k, v in keys.items() if k in {f.name for f in dataclasses.fields(cls)}}
    return cls(kind=kind, **keys)
