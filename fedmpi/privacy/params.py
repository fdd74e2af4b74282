"""The ``privacy:`` section: the keys every mechanism shares (a mechanism's own keys extend them,
``mechanism.Mechanism.Params``) and the checks a config can get before anything is built."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Literal, Optional

from ..errors import InputError
from ..registry import ALGORITHMS, MECHANISMS
from ..schema import Digest, opt


@dataclass
class PrivacyParams:
    mechanism: str = opt(
        "none", "client-level DP of the centralized algorithms (docs/PRIVACY.md): gaussian = DP-FedAvg (and "
                "DP-FedBuff), banded_mf = DP-FTRL with banded matrix-factorization noise, local_gaussian = local "
                "DP (each client noises its own update), distributed_dgauss / distributed_skellam = distributed DP "
                "(each client adds its share of discrete noise to its integers, the sum modulo 2^bits decoded)",
        selects=MECHANISMS, digest=Digest(off="none"))  # the section joined the resume digest with privacy
    clip: Optional[float] = opt(None, "C: each client's update is clipped to this L2 norm; null = no clipping "
                                      "(only with a zero noise_multiplier); at most 1e6 (beyond, the noise overflows "
                                      "float32)", gt=0, le=1e6)
    noise_multiplier: Optional[float] = opt(
        None, "sigma: noise of std sigma * C on the sum of updates; null = calibrated from privacy.epsilon; at most "
              "1e6", ge=0, le=1e6)
    target_quantile: Optional[float] = opt(
        None, "adaptive clipping (Andrew et al. 2021): the share of updates C should leave unclipped, "
              "privacy.clip then being the initial C; null = a fixed C", gt=0, lt=1)
    clip_lr: float = opt(0.2, "adaptive clipping: eta_C in C <- C exp(-eta_C (unclipped share - quantile))", gt=0)
    count_noise: Optional[float] = opt(
        None, "adaptive clipping: std of the noise on the sum of the bits (count_bits: centred: 2 x it > "
              "noise_multiplier; uncentred: it > noise_multiplier); null = expected cohort / 20", gt=0)
    count_bits: Literal["centred", "uncentred"] = opt(
        "centred", "adaptive clipping: the bits whose noisy sum estimates the unclipped share: centred (b_i - 1/2, "
                   "sensitivity 1/2, as TFF) or uncentred (b_i, sensitivity 1: a quarter of the RDP budget more)")
    noise_cohort_size: Optional[int] = opt(
        None, "noise as for an expected cohort of this many clients (pfl-research's noise_cohort_size): std sigma C / "
              "noise_cohort_size on the mean instead of sigma C / n~; the metric epsilon_production is that "
              "production cohort's (the same sampling over m noise_cohort_size / n~ clients), epsilon this run's "
              "(multiplier sigma n~ / noise_cohort_size)", ge=1)
    delta: float = opt(1e-6, "delta of the (epsilon, delta) guarantee reported as the metric epsilon", gt=0, lt=1)
    epsilon: Optional[float] = opt(None, "target epsilon after all rounds: calibrates noise_multiplier "
                                         "(then leave it null) in [1e-3, 1e4]; a target that needs more noise is "
                                         "refused", gt=0)
    amplification: Literal["auto", "required", "off"] = opt(
        "auto", "amplification by sampling in the accountant: auto = claimed where the availability kind samples "
                "at random, the algorithm's release hides who took part and the mechanism has the analysis "
                "(banded_mf: Poisson sampling, separation >= band); required = refuse a run where it is not; "
                "off = never (every participation charged in full)")
    accountant: Literal["rdp", "pld"] = opt(
        "rdp", "dp-accounting's accountant of the epsilon metric and the calibration: rdp (Renyi DP) or pld "
               "(privacy loss distributions: tighter, seconds per evaluation)",
        digest=Digest(absent="rdp"))  # the accountant of the checkpoints before this key


def check(cfg) -> None:
    """Cross-key checks of ``cfg.privacy`` that need nothing built (raise InputError naming the key);
    what needs the availability model (``Participation.sampling``) is checked when the run is built."""
    from .declaration import declaration

    p = cfg.privacy
    if p.mechanism == "none":
        given = next((f.name for f in fields(PrivacyParams) if f.name != "mechanism"
                      and getattr(p, f.name) != f.default), None)
        if given is not None:
            others = ", ".join(n for n in MECHANISMS.names() if n != "none")
            raise InputError(f"privacy.{given}: set to {getattr(p, given)!r}, but privacy.mechanism is none, which "
                             f"neither clips nor adds noise (nothing is private); choose a mechanism "
                             f"(privacy.mechanism: {others}) or remove privacy.{given} (or the whole privacy section)")
        return
    if (p.noise_multiplier is None) == (p.epsilon is None):
        raise InputError("privacy.noise_multiplier: give either noise_multiplier or a target privacy.epsilon "
                         f"(got noise_multiplier {p.noise_multiplier}, epsilon {p.epsilon})")
    if p.clip is None and (p.epsilon is not None or p.noise_multiplier > 0 or p.target_quantile is not None):
        what = "the initial C of adaptive clipping" if p.target_quantile is not None else \
            "the clip norm C the noise is calibrated to"
        raise InputError(f"privacy.clip: set {what}")
    declaration(ALGORITHMS.get(cfg.algorithm.name).obj, cfg.algorithm.name)
    try:
        import dp_accounting  # noqa: F401
    except ImportError:
        raise InputError("privacy.mechanism: the epsilon accountant needs the dp-accounting package "
                         "(pip install 'fedmpi[privacy]')") from None
