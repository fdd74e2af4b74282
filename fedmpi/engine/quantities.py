"""Per-client quantities of local training that an algorithm declares (``client_quantities``).

Local training always reports each client's mean minibatch loss, first loss and steps
(``engine.local.LocalStats``). An algorithm that needs more of what a client saw, e.g. Oort's
statistical utility (Lai et al., OSDI 2021: |B_i| sqrt(1/|B_i| sum_{k in B_i} loss(k)^2), from the
per-sample losses of the samples it trained on), declares ``ClientQuantity`` values; the trainer
then keeps every per-sample loss of every local step of the block (``SampleLosses``, float64 on
the host) and each quantity reduces them to one number per client. Nothing of this is computed
when no quantity is declared.

Where the per-sample losses come from: the closed form (a single linear layer) computes them
anyway; the stacked layers keep them from the gradient pass (``Loss.per_sample``, whose mean is
the minibatch loss); the vmap and sequential paths compute them by one more forward pass per
client at the same parameters and dropout keys. They are the losses of the step's own minibatch
at the model the step starts from, so the same sample drawn twice counts twice.

Contract of ``ClientQuantity.of``: row i of its result depends only on row i of its input
(client i's losses), never on which other clients share the block, so a client gets the same
number on any number of ranks, in any block and in a packed sweep.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class SampleLosses:
    """The per-sample training losses of one block of clients, over their local steps.

    ``values`` (S, n, b) float64: the loss of each sample of client j's minibatch at step s (at
    the model the step starts from); ``taken`` (S, n) bool: step s was one of client j's steps
    (a client that did fewer steps than the block has False, and zeros, after its last);
    ``weights`` (n, b) or None: ``train.full_gradient``'s sample weights (1 / n_j for each of its
    samples, 0 for padding), None for minibatches (each sample counts 1 / b)."""

    values: np.ndarray  # (S, n, b) float64: each sample's loss at each step (0 after a client's last)
    taken: np.ndarray  # (S, n) bool: the step was one of the client's steps
    weights: np.ndarray | None = None  # (n, b) full_gradient's sample weights; None: minibatches (1 / b each)

    def sample_mean(self, v: np.ndarray) -> np.ndarray:
        """(S, n) means over each minibatch of ``v`` (S, n, b) (weighted by ``weights`` when given)."""
        return v.mean(-1) if self.weights is None else (v * self.weights).sum(-1)

    def step_mean(self, v: np.ndarray) -> np.ndarray:
        """(n,) the mean of ``v`` (S, n) over each client's own steps (0 for a client with none)."""
        steps = self.taken.sum(0)
        return np.where(self.taken, v, 0.0).sum(0) / np.maximum(steps, 1)

    def first(self, v: np.ndarray) -> np.ndarray:
        """(n,) the value at each client's first step (at its start model; NaN without steps)."""
        return np.where(self.taken[0], v[0], np.nan) if len(v) else np.full(self.taken.shape[1], np.nan)

    def rows(self, cols: slice) -> SampleLosses:
        """The clients ``cols`` of the block."""
        return SampleLosses(self.values[:, cols], self.taken[:, cols],
                            None if self.weights is None else self.weights[cols])


@dataclass(frozen=True)
class ClientQuantity:
    """A per-client number of local training: ``name`` (the key of ``ClientOutputs.extra`` and,
    with ``store``, the dataset ``/client_rounds/<name>`` of the result file), ``of`` the function
    ``SampleLosses -> (n,)`` (row by row, see the module docstring), ``doc`` one line for the docs.
    ``store``: also write every round's values to the result file (rounds x m float64, NaN for a
    client that did not train: m * 8 bytes a round)."""

    name: str  # the key in ClientOutputs.extra (and /client_rounds/<name> with store)
    of: Callable[[SampleLosses], np.ndarray]  # SampleLosses -> (n,) float64, row by row
    doc: str = ""  # one line for the docs
    store: bool = False  # also write every round's values to /client_rounds/<name> (rounds x m)


def _mean_squared_loss(s: SampleLosses) -> np.ndarray:
    return s.step_mean(s.sample_mean(s.values * s.values))


#: the mean over a client's local steps of the mean squared per-sample loss of its minibatch:
#: 1/|B_i| sum_{k in B_i} loss(k)^2 over the samples B_i it trained on (Oort's utility is
#: |B_i| sqrt of it)
MEAN_SQUARED_LOSS = ClientQuantity("sq_loss", _mean_squared_loss,
                                   "mean over the local steps of the minibatch's mean squared per-sample loss")


def check_quantities(owner: str, quantities: tuple[ClientQuantity, ...]) -> None:
    """TypeError naming ``owner`` unless ``quantities`` are ``ClientQuantity`` values with distinct
    names that are identifiers (an author's mistake in code, not a config's)."""
    names = []
    for q in quantities:
        if not isinstance(q, ClientQuantity):
            raise TypeError(f"{owner}.client_quantities: {q!r} is not a fedmpi.engine.quantities.ClientQuantity")
        if not q.name.isidentifier() or q.name in names:
            raise TypeError(f"{owner}.client_quantities: name {q.name!r} is not a new identifier")
        names.append(q.name)
