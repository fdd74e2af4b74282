"""The record of every task the clock ran: who was asked when, when it finished, from which model
version, and whether its work counted (``/events`` in the result file, docs/FILES.md).

One event per task, written in the order the server processed them: a synchronous round's asked
clients by id, an asynchronous server step's arrivals in (finish time, client id) order. Columns:
``round`` (t + 1 for the round or server step t that processed it: the rounds done when it was
written, as every ``round`` column of a result file), ``client``, ``dispatch`` and ``finish``
(virtual seconds; for a failed task, when it failed), ``version`` (the model version it trained
from: the round, or the server steps done at its dispatch), ``staleness`` (server steps between
its dispatch and its arrival; 0 in a synchronous round) and ``outcome`` (``OUTCOMES``, stored as an
HDF5 enum of their names)."""

from __future__ import annotations

import numpy as np

#: outcome codes: kept (its update counted), late (after the deadline), failed (dropout),
#: surplus (over-selected, reported after the first K), stale (beyond algorithm.max_staleness)
OUTCOMES = ("kept", "late", "failed", "surplus", "stale")
#: int8 codes that carry their names (an HDF5 enum in the file: h5py, h5dump and pandas readers see them)
OUTCOME = np.dtype(np.int8, metadata={"enum": {name: code for code, name in enumerate(OUTCOMES)}})
EVENT_COLUMNS = {"round": np.int64, "client": np.int64, "dispatch": np.float64, "finish": np.float64,
                 "version": np.int64, "staleness": np.int64, "outcome": OUTCOME}


class Events:
    """The events of the last round or server step (every rank holds the same)."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.columns: dict[str, list[np.ndarray]] = {k: [] for k in EVENT_COLUMNS}

    def add(self, t: int, client: np.ndarray, dispatch: np.ndarray, finish: np.ndarray, version: np.ndarray,
            staleness: np.ndarray, outcome: np.ndarray) -> None:
        """Append events (arrays of one length, or scalars broadcast to it) processed in round ``t``."""
        n = len(np.atleast_1d(client))
        for name, value in (("round", t + 1), ("client", client), ("dispatch", dispatch), ("finish", finish),
                            ("version", version), ("staleness", staleness), ("outcome", outcome)):
            self.columns[name].append(np.broadcast_to(np.asarray(value, dtype=EVENT_COLUMNS[name]), (n,)))

    def take(self) -> dict[str, np.ndarray]:
        """The events added since the last ``take`` ({column: array}), and forget them."""
        out = {k: (np.concatenate(v) if v else np.zeros(0, dtype=EVENT_COLUMNS[k])) for k, v in self.columns.items()}
        self.clear()
        return out
