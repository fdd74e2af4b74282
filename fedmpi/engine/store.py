"""Client state kept between rounds, sharded over ranks (each rank holds its clients).

- ``VersionStore``: clients that hold a model which is always one of a few shared
  versions (FedSWE: an inactive client's x_i is a past global model). Each distinct
  version is stored once; clients hold an integer reference. Memory grows with the
  number of live versions, not with m.
- ``ClientTable``: a dense (n_local, d) table, one row per local client (MIFA's G_j,
  FedVARP's y_j, decentralized models). O(m d) overall by design, split over ranks.

Both keep float32 rows on the rank's device. Checkpoints save what the algorithms declare
(``fedmpi.state``): a ClientTable's ``rows``, FedSWE's versions by round.
"""

from __future__ import annotations

import numpy as np
import torch


class VersionStore:
    """Per-client references to deduplicated model versions for clients [lo, hi)."""

    def __init__(self, lo: int, hi: int, initial: torch.Tensor):
        self.lo, self.hi = lo, hi
        self.versions: dict[int, torch.Tensor] = {0: initial.detach().clone()}
        self.ref = np.zeros(hi - lo, dtype=np.int64)  # version id of each local client
        self._next = 1

    def gather(self, clients: np.ndarray) -> torch.Tensor:
        """The models (n, d) of the given global client ids (all local)."""
        refs = self.ref[clients - self.lo]
        uniq, inverse = np.unique(refs, return_inverse=True)
        stack = torch.stack([self.versions[int(v)] for v in uniq]) if len(uniq) else None
        if stack is None:
            d = next(iter(self.versions.values())).shape[0]
            return torch.empty(0, d, device=next(iter(self.versions.values())).device)
        return stack[torch.as_tensor(inverse, device=stack.device)]

    def assign(self, clients: np.ndarray, model: torch.Tensor) -> None:
        """Give the listed clients one new shared version ``model`` and drop unused versions."""
        if len(clients) == 0:
            return
        vid = self._next
        self._next += 1
        self.versions[vid] = model.detach().clone()
        self.ref[clients - self.lo] = vid
        live = set(np.unique(self.ref).tolist())
        for v in [v for v in self.versions if v not in live]:
            del self.versions[v]

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.versions.values())


class ClientTable:
    """A dense (hi - lo, d) float32 table indexed by global client id."""

    def __init__(self, lo: int, hi: int, d: int, device: torch.device, fill: torch.Tensor | None = None):
        self.lo, self.hi = lo, hi
        self.rows = torch.zeros(hi - lo, d, device=device) if fill is None else fill.expand(hi - lo, d).clone()

    def get(self, clients: np.ndarray) -> torch.Tensor:
        return self.rows[torch.as_tensor(clients - self.lo, device=self.rows.device)]

    def set(self, clients: np.ndarray, values: torch.Tensor) -> None:
        self.rows[torch.as_tensor(clients - self.lo, device=self.rows.device)] = values

