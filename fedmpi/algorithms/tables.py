"""The per-client update table shared by MIFA and FedVARP.

Each client j has a row T_j (MIFA's G_j, FedVARP's y_j), zero until j first participates.
Rows live in a ``ClientTable`` sharded over ranks (O(m d) memory by design, as the papers
say); the server keeps only the running sum S = sum_j T_j. In round t each active client
sends the innovation Delta_i - T_i, the reproducible reduction gives the server

    D = sum_{i in A_t} (Delta_i - T_i)

(the same bits for any number of ranks), S <- S + D, and every active client writes
T_i <- Delta_i. S therefore equals sum_j T_j up to the reduction's pre-rounding, and -- being
a sum of identical terms in identical order -- is itself identical for any number of ranks.
"""

from __future__ import annotations

import numpy as np
import torch

from ..engine.store import ClientTable
from .base import Context, ServerAlgorithm


class TableAlgorithm(ServerAlgorithm):
    """A ServerAlgorithm whose clients send Delta_i - T_i and then store T_i <- Delta_i.

    Subclasses write ``server_update`` with ``self.table_sum`` (S before this round) and call
    ``self.absorb(D)`` there to move S to the new table.
    """

    client_rows = 1  # T_j: one model-sized row per client (O(m d) overall, sharded)
    private = "its sum holds stored past updates (the table), not only this round's clipped updates"
    client_state = ("table.rows",)  # T_j of the local clients
    shared_state = ("table_sum",)  # S, used by the server

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        lo, hi = ctx.shard
        self.table = ClientTable(lo, hi, ctx.spec.dim, ctx.device)  # T_j of the local clients
        self.table_sum = torch.zeros(ctx.spec.dim, dtype=torch.float64, device=ctx.device)  # S (server)

    def contribution(self, t: int, active: np.ndarray, local: np.ndarray,
                     start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        return (end - start).double() - self.table.get(local).double()  # Delta_i - T_i

    def absorb(self, innovation_sum: torch.Tensor) -> None:
        """S <- S + D (server)."""
        self.table_sum = self.table_sum + innovation_sum

    def after_round(self, t: int, active: np.ndarray, local: np.ndarray,
                    start: torch.Tensor, end: torch.Tensor) -> None:
        if len(local):
            self.table.set(local, end - start)  # T_i <- Delta_i (float32, as stored)
