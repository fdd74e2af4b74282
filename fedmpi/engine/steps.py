"""How many local steps each client does in a round (``StepCounts``).

A client's nominal count c_i is s (``train.local_steps``), ceil(n_i E / B) with
``train.local_epochs`` E and B = ``train.batch_size``, or client i's entry of
``train.local_steps_file``. ``train.local_steps_draw`` then says how much of it the client does,
always clipped to 1..c_i:

- ``fixed``: c_i every round;
- ``uniform``: each round, uniform on 1..c_i (stragglers' partial work, FedProx/FedNova style):
  floor(u c_i) + 1;
- ``geometric``: each round, the client is interrupted after each step with probability q
  (``train.local_steps_stop``), so it does min(G, c_i) steps with G ~ Geometric(q) on 1, 2, ...:
  P(steps >= k) = (1 - q)^(k - 1) for k <= c_i, mean (1 - (1 - q)^c_i) / q -- the discrete
  analogue of an exponential fraction of the work;
- ``lognormal``: a device speed v_i = exp(sigma z_i), z_i ~ N(0, 1), drawn once per client
  (sigma = ``train.local_steps_sigma``; median speed 1): client i does floor(v_i c_i) steps every
  round, so the slower half of the devices are persistent stragglers and the faster half do c_i
  (a round's deadline fits c_i steps at the median speed).

Every draw is a pure function of (seed, round, client) through ``fedmpi.rng``: the per-round
draws use the stream (seed, "steps", t) with the client id as counter, the per-client speed the
stream (seed, "speed"). So every rank computes the same counts for any client, whichever other
clients it trains with, and the counts do not depend on the number of ranks.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .. import rng
from ..errors import InputError
from .local_step import TrainConfig


def read_steps(path: str, m: int) -> np.ndarray:
    """Client i's local steps from a text file of m whitespace-separated integers >= 1."""
    try:
        with open(path) as fh:
            words = fh.read().split()
    except OSError as e:
        raise InputError(f"train.local_steps_file: cannot read {path!r} ({e.strerror})") from None
    try:
        steps = np.array([int(w) for w in words], dtype=np.int64)
    except ValueError:
        raise InputError(f"train.local_steps_file: {path!r} must hold integers only") from None
    if len(steps) != m or (steps < 1).any():
        raise InputError(f"train.local_steps_file: {path!r} must hold one integer >= 1 per client ({m}), "
                         f"got {len(steps)} numbers, smallest {steps.min() if len(steps) else '-'}")
    return steps


class StepCounts:
    """Local step counts of any clients in any round (see the module docstring).

    ``sizes``: every client's number of training samples (m,), for ``local_epochs``."""

    def __init__(self, cfg: TrainConfig, sizes: Sequence[int], seed: int):
        self.cfg = cfg
        self.seed = seed
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.file = None if cfg.local_steps_file is None else read_steps(cfg.local_steps_file, len(self.sizes))
        self._draw: Callable[[np.ndarray, int, np.ndarray], np.ndarray] = getattr(self, f"_{cfg.local_steps_draw}")

    def nominal(self, clients: np.ndarray) -> np.ndarray:
        """c_i (n,): s, ceil(n_i E / B) or the file's count."""
        if self.file is not None:
            return self.file[clients]
        if self.cfg.local_epochs is None:
            return np.full(len(clients), self.cfg.local_steps, dtype=np.int64)
        need = self.sizes[clients] * self.cfg.local_epochs / self.cfg.batch_size
        return np.maximum(np.ceil(need - 1e-9), 1).astype(np.int64)

    def of(self, clients: np.ndarray, t: int) -> np.ndarray:
        """Local steps (n,) of ``clients`` (global ids) in 0-based round t, each in 1..c_i."""
        clients = np.asarray(clients, dtype=np.int64)
        return self._draw(clients, t, self.nominal(clients))

    # ------------------------------------------------------------------ the draws (clients, t, c) -> (n,)
    def _fixed(self, clients: np.ndarray, t: int, c: np.ndarray) -> np.ndarray:
        return c

    def _uniform(self, clients: np.ndarray, t: int, c: np.ndarray) -> np.ndarray:
        u = rng.uniform(rng.key(self.seed, "steps", t), clients)
        return np.minimum((u * c).astype(np.int64) + 1, c)

    def _geometric(self, clients: np.ndarray, t: int, c: np.ndarray) -> np.ndarray:
        u = rng.uniform(rng.key(self.seed, "steps", t), clients)
        done = np.floor(np.log1p(-u) / np.log1p(-self.cfg.local_steps_stop))  # steps after the first: P(>= k) = (1-q)^k
        return np.minimum(done, c - 1).astype(np.int64) + 1

    def _lognormal(self, clients: np.ndarray, t: int, c: np.ndarray) -> np.ndarray:
        log_speed = self.cfg.local_steps_sigma * rng.normal(rng.key(self.seed, "speed"), clients)
        speed = np.exp(np.minimum(log_speed, 0.0))  # a speed >= 1 does c_i steps anyway; no overflow
        return np.clip(np.floor(speed * c), 1, c).astype(np.int64)


#: the values of ``train.local_steps_draw`` (TrainConfig's Literal), each ``StepCounts._<name>``.
DRAWS = ("fixed", "uniform", "geometric", "lognormal")
