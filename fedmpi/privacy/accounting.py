"""Epsilon and noise calibration with Google's ``dp-accounting``: its RDP accountant, or its PLD
accountant (``privacy.accountant: pld``, tighter, slower); docs/PRIVACY.md.

The mechanism hands the event of ``rounds`` rounds (``Mechanism.event``) and its neighbouring
relation; this module only composes it. The PLD accountant discretises the privacy loss on a grid
(dp-accounting's default step 1e-4); at a small sigma or over many rounds the loss spreads over
so wide a range that the grid would need gigabytes (1.5 GB at sigma 0.1), so the step is widened
to keep at most ``PLD_POINTS`` points: the range is taken as 4 epsilon_RDP + 10 (measured from 0.7
to 400: the composed PLD spans at most 3.3 epsilon_RDP + 2). A wider step rounds every loss up, so epsilon
stays an upper bound, less tight by at most k steps.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING, Any

from ..errors import InputError

if TYPE_CHECKING:
    from ..participation import Sampling
    from .mechanism import Mechanism

logging.getLogger("absl").setLevel(logging.ERROR)  # the RDP orders it drops are not news to a user

PLD_STEP = 1e-4  # dp-accounting's default discretisation of the privacy loss
PLD_POINTS = 2**19  # at most this many grid points (~90 MB, ~3 s per epsilon)
LEAST_NOISE = 1e-3  # the smallest noise multiplier calibration tries (dp-accounting's search from there up)
#: the largest noise multiplier calibration gives (every mechanism). Beyond it the RDP accountant's epsilon
#: is flat (its finite orders: 0.00575 from 1e4 to 4e5 at delta 1e-6 over 2 rounds) until delta alone covers
#: the release (epsilon 0 near 7e5), so a smaller target is met only there, after a search of minutes
#: (dp-accounting doubles sigma from 1 and bisects to 1e-4 absolute: 50 evaluations, PLD's seconds each)
MOST_NOISE = 1e4


def _relation(name: str) -> Any:
    from dp_accounting import NeighboringRelation

    return NeighboringRelation.REPLACE_ONE if name == "replace_one" else NeighboringRelation.ADD_OR_REMOVE_ONE


def _accountant(relation: str, accountant: str, event: Any, delta: float) -> Any:
    """A fresh accountant (rdp or pld) for ``event``; the PLD's step bounded as the module says."""
    from dp_accounting.pld import PLDAccountant
    from dp_accounting.rdp import RdpAccountant

    if accountant != "pld":
        return RdpAccountant(neighboring_relation=_relation(relation))
    rdp = RdpAccountant(neighboring_relation=_relation(relation))
    rdp.compose(event)
    spread = 4 * rdp.get_epsilon(delta) + 10
    step = max(PLD_STEP, spread / PLD_POINTS) if math.isfinite(spread) else PLD_STEP
    return PLDAccountant(neighboring_relation=_relation(relation), value_discretization_interval=step)


def check(mechanism: Mechanism, sampling: Sampling, amplified: bool, accountant: str) -> None:
    """InputError naming ``privacy.accountant`` when it cannot compose the mechanism's event."""
    from dp_accounting.pld import PLDAccountant
    from dp_accounting.rdp import RdpAccountant

    if mechanism.curve:  # its own RDP curve (distributed noise): converted by dp-accounting's RDP conversion
        if accountant == "pld":
            raise InputError(f"privacy.accountant: pld has no event for the {type(mechanism).__name__} mechanism "
                             f"(its Renyi DP bound is the papers'); use privacy.accountant: rdp")
        return
    relation = _relation(mechanism.relation(sampling, amplified))
    acc = (PLDAccountant if accountant == "pld" else RdpAccountant)(neighboring_relation=relation)
    if not acc.supports(mechanism.event(sampling, amplified, 1.0, 1)):
        what = {"fixed_size": "a uniform sample of fixed size", "poisson": "Poisson sampling"}.get(
            sampling.kind, "this participation") if amplified else "this participation"
        raise InputError(f"privacy.accountant: {accountant} has no event for {what} with the "
                         f"{type(mechanism).__name__} mechanism; use privacy.accountant: rdp")


def epsilon(mechanism: Mechanism, sampling: Sampling, amplified: bool, sigma: float, rounds: int, delta: float,
            accountant: str = "rdp") -> float:
    """Epsilon at ``delta`` after ``rounds`` rounds (0 before the first, inf without noise)."""
    if rounds == 0:
        return 0.0
    if sigma == 0:
        return math.inf
    if mechanism.curve:
        from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

        orders, rdp = mechanism.rdp(sampling, sigma, rounds)
        return float(compute_epsilon(orders, rdp, delta)[0])
    event = mechanism.event(sampling, amplified, sigma, rounds)
    acc = _accountant(mechanism.relation(sampling, amplified), accountant, event, delta)
    acc.compose(event)
    return float(acc.get_epsilon(delta))


def calibrate(mechanism: Mechanism, sampling: Sampling, amplified: bool, target: float, rounds: int, delta: float,
              accountant: str = "rdp") -> float:
    """The smallest noise multiplier whose epsilon after ``rounds`` rounds is at most ``target``.

    PLD searches below the RDP answer (PLD's epsilon is the smaller, so is its sigma), from half
    of it."""
    from dp_accounting.mechanism_calibration import (ExplicitBracketInterval, LowerEndpointAndGuess,
                                                     calibrate_dp_mechanism)

    if mechanism.curve:
        return _calibrate_curve(mechanism, sampling, target, rounds, delta)
    bracket = LowerEndpointAndGuess(LEAST_NOISE, 1.0)
    if accountant == "pld":
        upper = calibrate(mechanism, sampling, amplified, target, rounds, delta, "rdp")
        bracket = ExplicitBracketInterval(upper / 2, upper)
    else:
        most = epsilon(mechanism, sampling, amplified, LEAST_NOISE, rounds, delta)
        if most <= target:
            raise InputError(f"privacy.epsilon: {target:g} is more than the epsilon of the least noise calibration "
                             f"tries (noise multiplier {LEAST_NOISE:g}: epsilon {most:.3g} over {rounds} rounds); "
                             f"give a smaller target, or privacy.noise_multiplier")
        least = epsilon(mechanism, sampling, amplified, MOST_NOISE, rounds, delta)
        if not least <= target:
            raise InputError(f"privacy.epsilon: {target:g} at delta {delta:g} over {rounds} rounds needs a noise "
                             f"multiplier above {MOST_NOISE:g}, the most calibration gives (epsilon {least:.3g} "
                             f"there); give a larger target, or privacy.noise_multiplier")
    relation = mechanism.relation(sampling, amplified)

    def event(s: float) -> Any:
        return mechanism.event(sampling, amplified, s, rounds)

    def fresh() -> Any:  # the PLD's step follows the sigma being tried (calibrate_dp_mechanism composes once)
        return _Fresh(relation, accountant, delta)

    from dp_accounting.mechanism_calibration import NoBracketIntervalFoundError

    try:
        sigma = float(calibrate_dp_mechanism(fresh, event, target, delta, bracket, tol=1e-4))
        reached = epsilon(mechanism, sampling, amplified, sigma, rounds, delta, accountant)
    except (NoBracketIntervalFoundError, ArithmeticError, ValueError):
        sigma, reached = math.nan, math.nan
    if not reached <= target:  # the library's search ended without a multiplier that reaches the target
        raise InputError(f"privacy.epsilon: {target:g} at delta {delta:g} over {rounds} rounds is out of reach of "
                         f"privacy.accountant {accountant} (the least epsilon it certifies is above it); give a "
                         f"larger target (or privacy.delta), or privacy.noise_multiplier")
    return sigma


def _calibrate_curve(mechanism: Mechanism, sampling: Sampling, target: float, rounds: int, delta: float) -> float:
    """``calibrate`` for a mechanism with its own RDP curve: bisection on log sigma (epsilon decreases in
    sigma) to a relative 1e-4; InputError naming privacy.epsilon when even MOST_NOISE does not reach it."""
    def eps(s: float) -> float:
        return epsilon(mechanism, sampling, False, s, rounds, delta)

    if eps(LEAST_NOISE) <= target:
        raise InputError(f"privacy.epsilon: {target:g} is more than the epsilon of the least noise calibration "
                         f"tries (noise multiplier {LEAST_NOISE:g}); give a smaller target, or "
                         f"privacy.noise_multiplier")
    if not eps(MOST_NOISE) <= target:
        raise InputError(f"privacy.epsilon: {target:g} at delta {delta:g} over {rounds} rounds is out of reach of "
                         f"privacy.mechanism {type(mechanism).__name__} (epsilon {eps(MOST_NOISE):.3g} even at noise "
                         f"multiplier {MOST_NOISE:g}: the rounding's sensitivity); give more privacy.bits or a larger "
                         f"target{' (or privacy.beta > 0)' if getattr(mechanism.params, 'beta', None) == 0 else ''}")
    lo, hi = math.log(LEAST_NOISE), math.log(MOST_NOISE)
    while hi - lo > 1e-4:
        mid = (lo + hi) / 2
        lo, hi = (lo, mid) if eps(math.exp(mid)) <= target else (mid, hi)
    return math.exp(hi)


class _Fresh:
    """An accountant made when the event is composed (its PLD step depends on the event)."""

    def __init__(self, relation: str, accountant: str, delta: float):
        self.relation, self.accountant, self.delta, self.inner = relation, accountant, delta, None

    @property
    def ledger(self) -> Any:  # calibrate_dp_mechanism insists on a fresh accountant
        from dp_accounting import NoOpDpEvent

        return NoOpDpEvent() if self.inner is None else self.inner.ledger

    def compose(self, event: Any, count: int = 1) -> "_Fresh":
        self.inner = _accountant(self.relation, self.accountant, event, self.delta)
        self.inner.compose(event, count)
        return self

    def get_epsilon(self, delta: float) -> float:
        return self.inner.get_epsilon(delta)
