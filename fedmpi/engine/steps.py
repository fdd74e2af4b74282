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
from ..inputs import read_input
from .local_step import TrainConfig


#: The most local steps one client may be given for one round (by ``local_steps``, ``local_epochs``
#: or the file): a bound of the representation (int32 step counters). The memory check
#: (``fedmpi.guards.step_inputs_bytes``) refuses far fewer on most machines: a block's minibatch
#: ids are drawn for all its steps at once.
MAX_STEPS = 2**31 - 1
MAX_FILE_BYTES = 64 * 2**20  # a steps file: m counts of at most 10 digits each
_KEY = "train.local_steps_file"


def read_steps(path: str, m: int) -> np.ndarray:
    """Client i's local steps from a text file of m whitespace-separated integers in 1..MAX_STEPS
    (read through ``fedmpi.inputs``: a special file is refused unopened, a big one unread)."""
    try:
        data = read_input(path, "steps file", _KEY, MAX_FILE_BYTES)
    except OSError as e:
        raise InputError(f"{_KEY}: cannot read {path!r} ({e.strerror or type(e).__name__})") from None
    try:
        words = data.decode("ascii").split()
    except UnicodeDecodeError as e:
        raise InputError(f"{_KEY}: {path!r} must hold integers only (byte {e.start} is not text)") from None
    bad = next((w for w in words if not w.lstrip("+-").isdigit()), None)
    if bad is not None:
        raise InputError(f"{_KEY}: {path!r} must hold integers only, got {bad[:40]!r}")
    big = next((i for i, w in enumerate(words) if len(w.lstrip("+-0")) > 10 or int(w) > MAX_STEPS), None)
    if big is not None:
        raise InputError(f"{_KEY}: {path!r}: client {big}'s count {words[big][:40]} is outside 1..{MAX_STEPS}, the "
                         f"local steps a round allows")
    steps = np.array([int(w) for w in words], dtype=np.int64)
    if len(steps) != m or (steps < 1).any():
        raise InputError(f"{_KEY}: {path!r} must hold one integer >= 1 per client ({m}), "
                         f"got {len(steps)} numbers, smallest {steps.min() if len(steps) else '-'}")
    return steps


def epoch_steps(sizes: np.ndarray, epochs: float, batch: int) -> np.ndarray:
    """ceil(n_i E / B) (at least 1) for every client; InputError naming ``train.local_epochs`` when
    the largest is beyond ``MAX_STEPS`` (computed in float64 first: 1e300 epochs neither overflow
    int64 nor warn)."""
    with np.errstate(over="ignore", invalid="ignore"):
        need = np.ceil(np.asarray(sizes, dtype=np.int64) * epochs / batch - 1e-9)  # the order of the counts so far
    most = int(np.argmax(need)) if len(need) else 0
    if len(need) and not need[most] <= MAX_STEPS:
        raise InputError(f"train.local_epochs: {epochs:g} epochs of client {most}'s {int(sizes[most])} samples at "
                         f"batch_size {batch} are {need[most]:.3g} local steps per round, more than the "
                         f"{MAX_STEPS} allowed")
    return np.maximum(need, 1).astype(np.int64)


class StepCounts:
    """Local step counts of any clients in any round (see the module docstring).

    ``sizes``: every client's number of training samples (m,), for ``local_epochs``."""

    def __init__(self, cfg: TrainConfig, sizes: Sequence[int], seed: int):
        self.cfg = cfg
        self.seed = seed
        self.sizes = np.asarray(sizes, dtype=np.int64)
        self.file = None if cfg.local_steps_file is None else read_steps(cfg.local_steps_file, len(self.sizes))
        self.epochs = None if cfg.local_epochs is None else epoch_steps(self.sizes, cfg.local_epochs, cfg.batch_size)
        self._draw: Callable[[np.ndarray, int, np.ndarray], np.ndarray] = getattr(self, f"_{cfg.local_steps_draw}")

    def nominal(self, clients: np.ndarray) -> np.ndarray:
        """c_i (n,): s, ceil(n_i E / B) or the file's count."""
        for per_client in (self.file, self.epochs):
            if per_client is not None:
                return per_client[clients]
        return np.full(len(clients), self.cfg.local_steps, dtype=np.int64)

    def most(self) -> int:
        """The largest c_i of any client: the most steps a block of clients can run in a round."""
        for per_client in (self.file, self.epochs):
            if per_client is not None:
                return int(per_client.max(initial=1))
        return int(self.cfg.local_steps)

    def least(self) -> np.ndarray:
        """The fewest steps (m,) each client can do in a round: c_i with the fixed draw, else 1."""
        every = np.arange(len(self.sizes))
        return self.nominal(every) if self.cfg.local_steps_draw == "fixed" else np.ones(len(every), dtype=np.int64)

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
