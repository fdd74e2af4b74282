"""One run's privacy: the clipping, the noise and the epsilon that ``ServerAlgorithm.round`` applies.

Round t (docs/PRIVACY.md):

    Delta_i  <- Delta_i * min(1, C / ||Delta_i||)       every participating client (every rank, its own)
    sum      <- sum_i w_i Delta_i,  w_i = 1 / n~        n~ the expected cohort (``Sampling.cohort``)
    sum      <- sum + sigma C / n~ * y_t                rank 0, the server; y_t from the mechanism

An algorithm whose summed rows are not that mean (FedSWE) declares, with its ``contribution``,
which part of the sum holds sum_i s_i Delta_i and the bound a / n >= |s_i|
(``ServerAlgorithm.private_part``); the noise is then sigma C a / n * y_t on that part.

Adaptive clipping (Andrew et al. 2021, ``privacy.target_quantile`` gamma): C follows the gamma
quantile of the update norms through a noisy sum of centred bits (``privacy.count_bits``),

    share    =  (sum_i (b_i - 1/2) + sigma_b xi_t) / n~ + 1/2      b_i = [||Delta_i|| <= C], xi_t ~ N(0, 1)
    C        <- C exp(-eta_C (share - gamma))

and the updates get the multiplier sigma_u = (sigma^-2 - (2 sigma_b)^-2)^(-1/2) instead of sigma, so
the pair (sum, bits) -- sensitivities C and 1/2 -- is one Gaussian mechanism of multiplier sigma
(uncentred bits: share = (sum_i b_i + sigma_b xi_t) / n~, sensitivity 1, sigma_b in place of 2 sigma_b).

``privacy.noise_cohort_size`` N scales every noise by n~ / N (the noise of a cohort of N).

The availability kind says how it picks clients (``Participation.sampling``), the algorithm what
its release shows (``Private``); amplification by sampling is claimed when the kind samples at
random and the release hides who took part. sigma and C are declared state (checkpointed by rank
0, restored on every rank), and so is the mechanism's own state.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from .. import rng
from ..errors import InputError
from ..participation import Participation, Sampling
from ..registry import MECHANISMS
from ..runtime import World
from ..state import State, Stateful
from . import accounting
from .declaration import Private
from .params import PrivacyParams

PROBED_ROUNDS = 64  # rounds of a mechanism's noise probed at set-up (on one coordinate)


class Privacy(Stateful):
    """Clipping and noise of one run (a no-op with ``mechanism: none``); see the module docstring.

    ``sampling``: the availability kind's description; ``amplified``: whether the accountant may
    claim amplification by sampling (the algorithm's release hides who took part). ``clip`` runs on
    every rank, collective with adaptive clipping (the count); ``noise`` on rank 0 only; both once
    per round, in order."""

    shared_state = ("sigma", "C")  # a resumed run keeps the noise it was calibrated with and the adapted C
    derived = ("C_used", "_epsilons")  # the clip of the current round; epsilons computed

    def __init__(self, params: PrivacyParams, sampling: Sampling | None, rounds: int, seed: int, dim: int,
                 world: World, amplified: bool = True):
        self.params, self.sampling, self.seed, self.world = params, sampling, seed, world
        self.on = params.mechanism != "none"
        self.sigma = np.float64(0.0)  # float64 in checkpoints (a Python float would be saved as float32)
        self.mechanism = None
        self.amplified = False
        if self.on:
            self.mechanism = MECHANISMS.get(params.mechanism).obj(params, dim, seed, world.device, rounds)
            self.amplified = (amplified and params.amplification != "off" and sampling.kind != "none"
                              and self.mechanism.amplifies(sampling))
            self._check_mechanism(rounds)
            accounting.check(self.mechanism, sampling, self.amplified, params.accountant)
            self.sigma = np.float64(params.noise_multiplier if params.epsilon is None else
                                    accounting.calibrate(self.mechanism, sampling, self.amplified, params.epsilon,
                                                         rounds, params.delta, params.accountant))
        self.C = np.float64(params.clip or 0.0)  # the clip of the next round (0: none)
        self.C_used = self.C  # the clip of the current round, which scales its noise
        self.adaptive = self.on and params.target_quantile is not None
        if self.adaptive and self.sigma > 0 and self.sigma_count / self.count_sensitivity <= self.sigma:
            twice = "2 x " if self.count_sensitivity < 1 else ""
            raise InputError(f"privacy.count_noise: adaptive clipping needs {twice}the count's noise "
                             f"{self.sigma_count:g} > the noise multiplier sigma = {self.sigma:.4g} "
                             f"(privacy.count_bits: {params.count_bits})")
        self._epsilons: dict[tuple[float, int], float] = {}  # (multiplier, rounds) -> epsilon, computed once
        if self.on:
            self._check_accountant(rounds)

    @classmethod
    def of_run(cls, cfg: Any, participation: Participation | None, declared: Private | None, dim: int,
               world: World) -> "Privacy":
        """The privacy of a run of ``cfg``: the availability kind's ``Sampling`` checked (a kind that
        does not describe itself, depends on the data or expects nobody is refused), the mechanism's
        needs of it checked (InputError naming the keys)."""
        p = cfg.privacy
        if p.mechanism == "none":
            return cls(p, None, cfg.rounds, cfg.seed, dim, world)
        sampling = sampling_of(cfg, participation)
        privacy = cls(p, sampling, cfg.rounds, cfg.seed, dim, world, amplified=declared.amplifiable)
        privacy.mechanism.check(cfg, sampling, privacy.amplified)
        if p.amplification == "required" and not privacy.amplified:
            raise InputError(f"privacy.amplification: required, but {not_amplified(cfg, sampling, declared)}")
        return privacy

    @property
    def cohort(self) -> float:
        """n~, the divisor of the noisy sum."""
        return self.sampling.cohort

    @property
    def noise_scale(self) -> float:
        """n~ / N with ``privacy.noise_cohort_size`` N (the noise of a cohort of N), else 1."""
        n = self.params.noise_cohort_size
        return 1.0 if n is None else self.cohort / n

    @property
    def sigma_count(self) -> float:
        """sigma_b, the std of the noise on adaptive clipping's bits (as for N clients with
        ``noise_cohort_size``: the run's is scaled by ``noise_scale``)."""
        return self.params.count_noise or (self.params.noise_cohort_size or self.cohort) / 20

    @property
    def count_sensitivity(self) -> float:
        """How far one client moves the sum of the bits: 1/2 centred, 1 uncentred."""
        return 0.5 if self.params.count_bits == "centred" else 1.0

    @property
    def sigma_update(self) -> float:
        """sigma_u, the multiplier of the noise on the sum (sigma without adaptive clipping)."""
        if not (self.adaptive and self.sigma > 0):
            return self.sigma
        return (self.sigma ** -2 - (self.sigma_count / self.count_sensitivity) ** -2) ** -0.5

    def clip(self, t: int, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """End models whose updates end - start are clipped to norm C (``end`` itself without clipping);
        with adaptive clipping, then C for round t + 1."""
        self.C_used = self.C
        C = float(self.C)  # a Python float in tensor arithmetic, on any device
        if not self.on or C == 0:
            return end
        delta = end - start
        norm = delta.double().norm(dim=1)
        if self.adaptive:  # centred bits: a zero update (a zeroed client) adds 0 to the bit sum, not +1/2
            counted = norm > 0 if self.params.count_bits == "centred" else torch.ones_like(norm, dtype=torch.bool)
            self._adapt(t, int(((norm <= C) & counted).sum()), int(counted.sum()))
        scale = (C / torch.clamp(norm, min=C)).to(delta.dtype)  # min(1, C / ||Delta_i||)
        return start + delta * scale[:, None]

    def _adapt(self, t: int, unclipped: int, clients: int) -> None:
        """C <- C exp(-eta_C (share - gamma)) from the noisy count over all ranks (collective);
        ``unclipped`` of the ``clients`` whose bits count (centred: those with a non-zero update)."""
        count, n = self.world.allreduce_sum_(torch.tensor([float(unclipped), float(clients)], dtype=torch.float64,
                                                          device=self.world.device)).tolist()
        xi = float(rng.normal(rng.key(self.seed, "privacy_count", t), 0)) if self.sigma > 0 else 0.0
        noise = self.sigma_count * self.noise_scale * xi
        if self.params.count_bits == "centred":
            share = (count - n / 2 + noise) / self.cohort + 0.5
        else:
            share = (count + noise) / self.cohort
        p = self.params
        self.C = np.float64(self.C * np.exp(-p.clip_lr * (share - p.target_quantile)))

    @property
    def noisy(self) -> bool:
        """Whether ``noise`` adds anything (not with sigma = 0)."""
        return self.on and self.sigma > 0

    def noise(self, t: int, dim: int, device: torch.device, bound: float = 1.0,
              divisor: float | None = None) -> torch.Tensor:
        """sigma_u C bound / divisor * y_t (y_t the mechanism's), float64, for a sum of s_i Delta_i with
        |s_i| <= bound / divisor (default: the mean, 1 / n~); rank 0, rounds in order, only when ``noisy``."""
        y = self.mechanism.noise(t, dim).to(device)
        scale = self.sigma_update * self.C_used * bound / (self.cohort if divisor is None else divisor)
        return y * float(scale if self.params.noise_cohort_size is None else scale * self.noise_scale)

    def add_noise(self, t: int, part: torch.Tensor, bound: float, divisor: float) -> None:
        """Add ``noise`` to ``part``, the private view of the summed rows, in place (rank 0)."""
        part += self.noise(t, part.shape[0], part.device, bound, divisor)

    @property
    def applied(self) -> float:
        """The noise multiplier each release really gets, relative to its sensitivity (one client's
        update, C bound / divisor): sigma, scaled by ``noise_scale`` under ``privacy.noise_cohort_size``
        (adaptive clipping: the pair of the sum and the bits, both scaled)."""
        return float(self.sigma) * self.noise_scale

    @property
    def production(self) -> bool:
        """Whether the noise is a production cohort's (``privacy.noise_cohort_size``): then
        ``epsilon_production`` is that cohort's epsilon and ``epsilon`` this run's."""
        return self.on and self.params.noise_cohort_size is not None

    def epsilon(self, rounds: int, production: bool = False) -> float:
        """Epsilon at ``privacy.delta`` after ``rounds`` rounds of the noise this run applied, or
        (``production``) of sigma, the noise of the production cohort of ``privacy.noise_cohort_size``."""
        sigma = float(self.sigma) if production else self.applied
        if (sigma, rounds) not in self._epsilons:
            p = self.params
            self._epsilons[sigma, rounds] = accounting.epsilon(self.mechanism, self.sampling, self.amplified, sigma,
                                                               rounds, p.delta, p.accountant)
        return self._epsilons[sigma, rounds]

    @property
    def metric_names(self) -> tuple[str, ...]:
        """The metrics ``metrics`` gives: ``epsilon``, and ``epsilon_production`` under
        ``privacy.noise_cohort_size``; none without a mechanism."""
        return () if not self.on else ("epsilon", "epsilon_production") if self.production else ("epsilon",)

    def metrics(self, rounds: int) -> dict[str, float]:
        """The ``metric_names`` after ``rounds`` rounds (rank 0, at an evaluation)."""
        row = {"epsilon": self.epsilon(rounds)} if self.on else {}
        if self.production:
            row["epsilon_production"] = self.epsilon(rounds, production=True)
        return row

    def round_record(self) -> dict[str, float]:
        """The numbers of the last release for the result file: ``privacy/noise_multiplier`` (sigma,
        calibrated or given) and ``privacy/applied_noise_multiplier`` (``applied``, what the noise
        really was relative to the release's sensitivity, from which ``epsilon`` is composed)."""
        if not self.on:
            return {}
        return {"privacy/noise_multiplier": float(self.sigma), "privacy/applied_noise_multiplier": self.applied}

    # ---------------------------------------------------------------- set-up checks (exit 2 on every rank)
    def _check_mechanism(self, rounds: int) -> None:
        """What a mechanism says of itself: a finite sensitivity > 0 and, for a plug-in's, finite noise
        in its first rounds (probed on a fresh instance of one coordinate)."""
        name = self.params.mechanism
        s = self.mechanism.sensitivity(self.sampling, self.amplified)
        if not (isinstance(s, (int, float, np.number)) and math.isfinite(s) and s > 0):
            raise InputError(f"privacy.mechanism: {name}'s sensitivity() is {s!r}; it must be a finite number > 0 "
                             f"(how far one client's participation moves what the noise covers, in units of "
                             f"privacy.clip)")
        if MECHANISMS.get(name).builtin:  # the built-ins check their parameters themselves
            return
        probe = type(self.mechanism)(self.params, 1, self.seed, torch.device("cpu"), rounds)
        for t in range(min(rounds, PROBED_ROUNDS)):
            y = probe.noise(t, 1)
            if not bool(torch.isfinite(y).all()):
                raise InputError(f"privacy.mechanism: {name}'s noise is not finite in round {t} ({float(y[0])}); "
                                 f"a mechanism's noise(t, dim) must be finite numbers (check its parameters)")

    def _check_accountant(self, rounds: int) -> None:
        """Epsilon after the run's rounds can be computed (kept for the last evaluation): else one line
        naming the key that set the noise, and what to change."""
        try:
            self.metrics(rounds)
        except (ArithmeticError, ValueError, MemoryError) as e:  # dp-accounting overflows at a tiny multiplier
            p = self.params
            key = ("privacy.noise_cohort_size" if self.production else "privacy.epsilon" if p.epsilon is not None
                   else "privacy.noise_multiplier")
            raise InputError(f"{key}: the noise applied (multiplier {self.applied:.3g}) is too small for "
                             f"privacy.accountant {p.accountant} to compose over {rounds} rounds "
                             f"({type(e).__name__}: {str(e)[:60]}); use privacy.accountant: rdp, or more noise") \
                from None

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> State:
        """sigma, C and the mechanism's state, under one name each."""
        state = super().state_dict()
        if self.mechanism is not None:
            state.shared.update(self.mechanism.state_dict().shared)
        return state

    def load_state_dict(self, state: State) -> None:
        super().load_state_dict(State(shared={k: state.shared[k] for k in ("sigma", "C") if k in state.shared}))
        if self.mechanism is not None:
            self.mechanism.load_state_dict(state)


def sampling_of(cfg: Any, participation: Participation | None) -> Sampling:
    """What ``cfg``'s availability kind says of its sampling over the run's rounds, checked for privacy."""
    kind = cfg.availability.kind
    sampling = participation.sampling(cfg.rounds) if participation is not None else None
    if sampling is None:
        raise InputError(f"privacy.mechanism: availability.kind {kind!r} does not describe how it picks clients "
                         f"(Participation.sampling, docs/PLUGINS.md), which the accountant needs")
    if sampling.data:
        raise InputError(f"{sampling.data}: with it availability.kind {kind!r} picks clients by their data, which "
                         f"privacy.mechanism cannot protect (use a base that does not read the clients' data)")
    if not sampling.cohort > 0:
        raise InputError(f"availability.kind: {kind!r} expects {sampling.cohort:g} clients per round (are all p_i "
                         f"0?), and privacy.mechanism divides the noisy sum by that expected cohort")
    return sampling


def not_amplified(cfg: Any, sampling: Sampling, declared: Private) -> str:
    """Why amplification by sampling is not claimed for ``cfg`` (naming the keys)."""
    kind, name, mechanism = cfg.availability.kind, cfg.algorithm.name, cfg.privacy.mechanism
    if not declared.amplifiable:
        return (f"algorithm.name {name!r} shows who took part in its release (its privacy declaration), "
                f"so every participation is charged in full")
    if sampling.kind == "none":
        return f"availability.kind {kind!r} picks clients with nothing random to amplify"
    return (f"privacy.mechanism {mechanism!r} has no amplified analysis for availability.kind {kind!r} "
            f"({sampling.kind.replace('_', '-')} sampling)")
