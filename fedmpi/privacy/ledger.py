"""What the accountant composes: the releases of a run (docs/PRIVACY.md, "Accounting").

A synchronous round is one release, and who may take part in it is the availability kind's draw:
the accountant charges each client the kind's bound on its participations (``Sampling``), the
same for every client, so nothing needs counting. An asynchronous server's step is one release
too, but who contributes to it is the clock's schedule, public and independent of the data, known
only as the run goes: the ledger counts, for every client j,

    charge_j = sum_r n_{j,r}^2          n_{j,r}: j's updates in release r

(a release holding n of j's updates moves by at most n C, a Gaussian of multiplier sigma / n, whose
Renyi divergence is that of n^2 Gaussians of multiplier sigma), and the accountant composes
k = max_j charge_j Gaussians of multiplier sigma -- without amplification, the schedule being public.
The counts are the run's state (rank 0 records them, a checkpoint keeps them).
"""

from __future__ import annotations

import numpy as np
import torch

from ..state import State, Stateful


class Ledger(Stateful):
    """The releases of one run; ``counted``: who contributed to each is counted (an asynchronous
    server's steps), else the kind's sampling bounds it (nothing kept). ``record`` runs where the
    release is made (rank 0 for an asynchronous step)."""

    derived = ("charges",)  # saved by ``state_dict`` when counted (with ``releases``)
    configuration = ("counted",)

    def __init__(self, m: int, counted: bool):
        self.counted = counted
        self.charges = np.zeros(m if counted else 0, dtype=np.float64)  # sum over releases of n_{j,r}^2
        self.releases = 0  # counted releases so far (the index of the next one's noise)

    def record(self, contributors: np.ndarray | None) -> None:
        """One release whose sum holds an update of each entry of ``contributors`` (repeats: several)."""
        if not self.counted:
            return
        self.releases += 1
        if contributors is not None and len(contributors):
            ids, n = np.unique(np.asarray(contributors, dtype=np.int64), return_counts=True)
            self.charges[ids] += n.astype(np.float64) ** 2

    @property
    def most(self) -> int:
        """k = max_j charge_j, the releases the most charged client pays for (counted only)."""
        return int(self.charges.max()) if self.charges.size else 0

    def state_dict(self) -> State:
        if not self.counted:
            return State()
        return State(shared={"charges": torch.from_numpy(self.charges.copy()),
                             "releases": torch.tensor(self.releases, dtype=torch.int64)})

    def load_state_dict(self, state: State) -> None:
        if self.counted:
            self.charges = state.shared["charges"].cpu().numpy().astype(np.float64, copy=True)
            self.releases = int(state.shared["releases"].item())
