"""The ``privacy:`` config section (one dataclass) and its cross-key checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional

from .. import registry
from ..schema import opt
from ..errors import InputError

#: availability kinds whose sampling the accountant knows (``sampling.Sampling``)
KNOWN_SAMPLING = ("always", "cohort", "stationary", "cyclic", "markov")
#: Bernoulli kinds (p_i^t known): enough for an algorithm that claims no amplification (FedSWE)
BERNOULLI = ("stationary", "cyclic", "staircase", "sine", "interleaved_sine", "periodic_groups")


@dataclass
class PrivacyParams:
    mechanism: Literal["none", "gaussian", "banded_mf"] = opt(
        "none", "client-level DP of the centralized algorithms (docs/PRIVACY.md): gaussian = DP-FedAvg, "
                "banded_mf = DP-FTRL with banded matrix-factorization noise")
    clip: Optional[float] = opt(None, "C: each client's update is clipped to this L2 norm; null = no clipping "
                                      "(only with a zero noise_multiplier)", gt=0)
    noise_multiplier: Optional[float] = opt(
        None, "sigma: noise of std sigma * C on the sum of updates; null = calibrated from privacy.epsilon", ge=0)
    target_quantile: Optional[float] = opt(
        None, "adaptive clipping (Andrew et al. 2021): the share of updates C should leave unclipped, "
              "privacy.clip then being the initial C; null = a fixed C", gt=0, lt=1)
    clip_lr: float = opt(0.2, "adaptive clipping: eta_C in C <- C exp(-eta_C (unclipped share - quantile))", gt=0)
    count_noise: Optional[float] = opt(
        None, "adaptive clipping: std of the noise on the count of unclipped updates (> noise_multiplier); "
              "null = expected cohort / 20", gt=0)
    band: int = opt(1, "b: bands of banded_mf's factor (1 = independent noise); needs separation >= b", ge=1)
    delta: float = opt(1e-6, "delta of the (epsilon, delta) guarantee reported as the metric epsilon", gt=0, lt=1)
    epsilon: Optional[float] = opt(None, "target epsilon after all rounds: calibrates noise_multiplier "
                                         "(then leave it null)", gt=0)
    accountant: Literal["rdp", "pld"] = opt(
        "rdp", "dp-accounting's accountant of the epsilon metric and the calibration: rdp (Renyi DP) or pld "
               "(privacy loss distributions: tighter, seconds per evaluation)")


def separation_of(cfg) -> int:
    """The fewest rounds between two participations of one client that ``cfg.availability`` guarantees."""
    av = cfg.availability
    return {"markov": getattr(av, "R", 0) + 1, "cyclic": getattr(av, "groups", 1)}.get(av.kind, 1)


def applies_to(algorithm: type) -> bool:
    """Whether the mechanism applies to an algorithm class (``ServerAlgorithm.private_sum``)."""
    return bool(getattr(algorithm, "private_sum", lambda: False)())


def check(cfg) -> None:
    """Cross-key checks of ``cfg.privacy`` (raise InputError naming the key)."""
    p = cfg.privacy
    if p.mechanism == "none":
        return
    if (p.noise_multiplier is None) == (p.epsilon is None):
        raise InputError("privacy.noise_multiplier: give either noise_multiplier or a target privacy.epsilon "
                         f"(got noise_multiplier {p.noise_multiplier}, epsilon {p.epsilon})")
    if p.clip is None and (p.epsilon is not None or p.noise_multiplier > 0 or p.target_quantile is not None):
        what = "the initial C of adaptive clipping" if p.target_quantile is not None else \
            "the clip norm C the noise is calibrated to"
        raise InputError(f"privacy.clip: set {what}")
    algorithm = registry.ALGORITHMS.get(cfg.algorithm.name).obj
    if not applies_to(algorithm):
        able = [e.name for e in registry.ALGORITHMS.entries() if applies_to(e.obj)]
        raise InputError(f"privacy.mechanism: algorithm {cfg.algorithm.name!r} does not declare the sum of clipped "
                         f"updates its server step reads, which the noise is calibrated to (use one of "
                         f"{', '.join(able)})")
    kinds = KNOWN_SAMPLING if getattr(algorithm, "hides_participation", True) else \
        tuple(dict.fromkeys(KNOWN_SAMPLING + BERNOULLI))
    if cfg.availability.kind not in kinds:
        raise InputError(f"privacy.mechanism: availability.kind {cfg.availability.kind!r} has no sampling model "
                         f"the accountant knows for {cfg.algorithm.name!r} (use one of {', '.join(kinds)})")
    fixed_size = cfg.availability.kind == "cohort" and cfg.availability.size < cfg.task.clients
    if p.accountant == "pld" and fixed_size and getattr(algorithm, "hides_participation", True):
        raise InputError("privacy.accountant: pld has no event for a uniform sample of fixed size "
                         "(availability.kind 'cohort'); use privacy.accountant: rdp")
    sep = separation_of(cfg)
    if p.mechanism == "banded_mf" and sep < p.band:
        how = {"markov": f"availability.R >= {p.band - 1}", "cyclic": f"availability.groups >= {p.band}"}
        raise InputError(f"privacy.band: banded_mf needs participations >= b = {p.band} rounds apart, "
                         f"availability.kind {cfg.availability.kind!r} guarantees {sep} "
                         f"(set {how.get(cfg.availability.kind, 'availability.kind: markov or cyclic')} "
                         f"or privacy.band <= {sep})")
    try:
        import dp_accounting  # noqa: F401
    except ImportError:
        raise InputError("privacy.mechanism: the epsilon accountant needs the dp-accounting package "
                         "(pip install 'fedmpi[privacy]')") from None
