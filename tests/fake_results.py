"""Result files written directly with the ResultWriter (no training): fast inputs for tests of
tables, plots, exports and info."""

from __future__ import annotations

import numpy as np

from conftest import synthetic_config
from fedmpi import config
from fedmpi.results.hdf5 import ResultWriter, claim


def fake_result(path, metrics: dict[str, list[float]], status: str = "completed", **over) -> str:
    """A result file of ``synthetic_config(**over)`` holding ``metrics`` (with 'round')."""
    cfg = config.from_dict(synthetic_config(**over))
    names = [k for k in metrics if k != "round"]
    c = claim(str(path), cfg.resume_digest())
    w = ResultWriter(str(path), cfg.to_yaml(), cfg.seed, 1, names, cfg.task.clients, False, claim_=c)
    for i, r in enumerate(metrics["round"]):
        w.append({k: v[i] for k, v in metrics.items()}, int(r))
    w.finish(status, np.zeros(3) if status == "completed" else None, int(metrics["round"][-1]))
    return str(path)
