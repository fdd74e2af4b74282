"""Epsilon and noise calibration with Google's ``dp-accounting``: its RDP accountant, or its PLD
accountant (``privacy.accountant: pld``, tighter, slower); docs/PRIVACY.md.

One round is one Gaussian mechanism of noise multiplier sigma (noise std / per-client
sensitivity C) on the sum of clipped updates. Over ``rounds`` rounds a client is seen in at
most ``k = sampling.participations(rounds)`` of them:

- DP-FedAvg under independent (Poisson) participation of probability q: k Poisson-subsampled
  Gaussians (add/remove adjacency); under a uniform sample of fixed size: k sampled-without-
  replacement Gaussians (replace-one adjacency, sensitivity 2C: multiplier sigma / 2);
- otherwise, and for banded MF under b-min-separation (its factor has unit column norms, so
  sensitivity = sqrt(k) C, docs/PRIVACY.md): k Gaussians of multiplier sigma, no amplification.
"""

from __future__ import annotations

import logging
import math

from .sampling import Sampling

logging.getLogger("absl").setLevel(logging.ERROR)  # the RDP orders it drops are not news to a user


def dp_event(sampling: Sampling, sigma: float, rounds: int, mechanism: str):
    """The ``dp_accounting`` event of ``rounds`` rounds of ``mechanism`` at noise multiplier ``sigma``."""
    import dp_accounting as dp

    k = sampling.participations(rounds)
    if mechanism == "gaussian" and sampling.fixed is not None:
        m, size = sampling.fixed
        one = dp.SampledWithoutReplacementDpEvent(m, size, dp.GaussianDpEvent(sigma / 2))
    elif mechanism == "gaussian" and sampling.q < 1:
        one = dp.PoissonSampledDpEvent(sampling.q, dp.GaussianDpEvent(sigma))
    else:
        one = dp.GaussianDpEvent(sigma)
    return dp.SelfComposedDpEvent(one, k)


def _accountant(sampling: Sampling, mechanism: str, accountant: str = "rdp"):
    """A fresh ``dp_accounting`` accountant (``accountant``: rdp or pld) with the adjacency of the event."""
    from dp_accounting import NeighboringRelation
    from dp_accounting.pld import PLDAccountant
    from dp_accounting.rdp import RdpAccountant

    replace = mechanism == "gaussian" and sampling.fixed is not None
    relation = NeighboringRelation.REPLACE_ONE if replace else NeighboringRelation.ADD_OR_REMOVE_ONE
    return (PLDAccountant if accountant == "pld" else RdpAccountant)(neighboring_relation=relation)


def epsilon(sampling: Sampling, sigma: float, rounds: int, delta: float, mechanism: str,
            accountant: str = "rdp") -> float:
    """Epsilon at ``delta`` after ``rounds`` rounds (0 before the first, inf without noise)."""
    if rounds == 0:
        return 0.0
    if sigma == 0:
        return math.inf
    acc = _accountant(sampling, mechanism, accountant)
    acc.compose(dp_event(sampling, sigma, rounds, mechanism))
    return float(acc.get_epsilon(delta))


def calibrate(sampling: Sampling, target: float, rounds: int, delta: float, mechanism: str,
              accountant: str = "rdp") -> float:
    """The smallest noise multiplier whose epsilon after ``rounds`` rounds is at most ``target``.

    PLD searches below the RDP answer (PLD's epsilon is the smaller, so is its sigma), from half
    of it: its discretised loss distribution at a tiny sigma would not fit in memory."""
    from dp_accounting.mechanism_calibration import (ExplicitBracketInterval, LowerEndpointAndGuess,
                                                     calibrate_dp_mechanism)

    bracket = LowerEndpointAndGuess(1e-3, 1.0)
    if accountant == "pld":
        upper = calibrate(sampling, target, rounds, delta, mechanism, "rdp")
        bracket = ExplicitBracketInterval(upper / 2, upper)
    return float(calibrate_dp_mechanism(lambda: _accountant(sampling, mechanism, accountant),
                                        lambda s: dp_event(sampling, s, rounds, mechanism), target, delta,
                                        bracket, tol=1e-4))
