"""One run's privacy: the release of a sum that the server asks for, and its accounting.

A release (docs/PRIVACY.md, docs/DESIGN.md "A release") is the one call a server makes with the
clients' updates and its way of summing them (``Privacy.release``):

    Delta_i  <- bound(Delta_i)                     every rank, its clients: ||Delta_i|| <= C (``clipping``)
    Delta_i  <- Delta_i + sigma C z_{t,i}          local DP only: each client's own noise (``local``)
    S        =  summed(rows of the Delta_i)         the algorithm's sum (collective; rank 0 holds it):
                                                   reproducible, or secure aggregation's (``secured``:
                                                   quantized, masked, unmasked; ``aggregation``)
    S        <- S + sigma_u C bound / divisor y_t  central DP only, rank 0: on the part that holds the
                                                   updates (``private_part``: |s_i| <= bound / divisor)
    ledger   <- the release                         what the accountant composes (``ledger``)

A synchronous round is one release with divisor n~, the fixed expected cohort (``Sampling.cohort``);
an asynchronous server's step is one release of its buffer (``client_side`` when a client's
update is made, ``server_side`` at the step, the two halves of ``release``). An algorithm whose
summed rows are not that mean (FedSWE) declares, with its ``contribution``, which part of the sum
holds sum_i s_i Delta_i and the bound a / n >= |s_i| (``ServerAlgorithm.private_part``).

With adaptive clipping the bits' noise takes its share of sigma (``Clip.split``: the sum gets
sigma_u); ``privacy.noise_cohort_size`` N scales every noise by n~ / N (the noise of a cohort of N).
The availability kind says how it picks clients (``Participation.sampling``), the algorithm what its
release shows (``Private``); amplification by sampling is claimed when the kind samples at random
and the release hides who took part. sigma, C, the mechanism's state and the ledger's counts are
declared state (checkpointed by rank 0, restored on every rank).
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Callable

import numpy as np
import torch

from ..errors import InputError
from ..participation import Participation, Sampling
from ..registry import MECHANISMS
from ..runtime import World
from ..state import State, Stateful
from . import accounting
from .aggregation import AggregationParams, SecureAggregation, cohort_of, margin, participation_decides_aborts
from .clipping import Clip
from .declaration import Private, declaration
from .ledger import Ledger
from .params import PrivacyParams

PROBED_ROUNDS = 64  # rounds of a mechanism's noise probed at set-up (on one coordinate)

#: the private part of a summed buffer: (view holding sum_i s_i Delta_i, bound, divisor), |s_i| <= bound / divisor
Part = Callable[[torch.Tensor], "tuple[torch.Tensor, float, float]"]


def whole(total: torch.Tensor) -> tuple[torch.Tensor, float, float]:
    """The private part of a plain sum of weighted updates with weights |s_i| <= 1: all of it."""
    return total, 1.0, 1.0


class Privacy(Stateful):
    """The privacy of one run (a no-op with ``mechanism: none``); see the module docstring.

    ``sampling``: the availability kind's description; ``amplified``: whether the accountant may
    claim amplification by sampling (the algorithm's release hides who took part); ``counted``: who
    contributes to each release is counted as the run goes (an asynchronous server; ``m`` clients).
    ``release`` runs on every rank, collective as its sum is (and with adaptive clipping);
    ``server_side`` on rank 0; both once per release, in order."""

    shared_state = ("sigma",)  # a resumed run keeps the noise it was calibrated with
    derived = ("_epsilons",)  # epsilons computed (a cache)
    components = ("clipping", "mechanism", "ledger")  # their state is saved with sigma
    state_prefix = "privacy."  # its keys in the server's checkpoint
    configuration = ("params", "sampling", "seed", "world", "on", "amplified", "amplification", "secure")

    def __init__(self, params: PrivacyParams, sampling: Sampling | None, rounds: int, seed: int, dim: int,
                 world: World, amplified: bool = True, m: int = 0, counted: bool = False,
                 aggregation: AggregationParams | None = None):
        self.params, self.sampling, self.seed, self.world = params, sampling, seed, world
        self.on = params.mechanism != "none"
        self.sigma = np.float64(0.0)  # float64 in checkpoints (a Python float would be saved as float32)
        self.mechanism = None
        self.amplified = False
        self.amplification = ""  # whether amplification is claimed, and why (``of_run``; the result file's note)
        self.ledger = Ledger(m, self.on and counted)
        if self.on:
            self.mechanism = MECHANISMS.get(params.mechanism).obj(params, dim, seed, world.device, rounds)
            self.mechanism.population = max(m, 1)
            self.amplified = (amplified and not counted and params.amplification != "off"
                              and sampling.kind != "none" and self.mechanism.amplifies(sampling)
                              and not participation_decides_aborts(aggregation, sampling))
            self._check_mechanism(rounds)
            accounting.check(self.mechanism, sampling, self.amplified, params.accountant)
            self.sigma = np.float64(params.noise_multiplier if params.epsilon is None else
                                    accounting.calibrate(self.mechanism, sampling, self.amplified, params.epsilon,
                                                         rounds, params.delta, params.accountant))
        self.clipping = Clip(params, sampling.cohort if self.on else 1.0, seed, world, self.sigma > 0,
                             self.noise_scale) if self.on else None
        if self.on:
            self.clipping.check(float(self.sigma))
        self._epsilons: dict[tuple[float, int, bool], float] = {}  # (multiplier, rounds, counted) -> epsilon
        if self.on:
            self._check_accountant(rounds)
        #: secure aggregation (``aggregation.kind: secagg``), else None: the plain reproducible sum
        self.secure = None if aggregation is None or not aggregation.on else SecureAggregation(aggregation, seed,
                                                                                               world, m)
        quantizes = self.secure is not None and not (self.on and self.mechanism.noise_at == "distributed")
        if quantizes and aggregation.clip_range is None and margin(dim, aggregation.bits) <= 0:
            raise InputError(f"aggregation.bits: rounding {dim} coordinates to 2^{aggregation.bits - 1} - 1 levels can "
                             f"move a client's row by sqrt({dim}) / (2^{aggregation.bits - 1} - 1) = "
                             f"{1 - margin(dim, aggregation.bits):.2f} of privacy.clip's bound, which the row must "
                             f"leave room for (raise aggregation.bits)")

    @classmethod
    def of_run(cls, cfg: Any, participation: Participation | None, algorithm: type, dim: int,
               world: World) -> "Privacy":
        """The privacy of a run of ``cfg`` by the algorithm class ``algorithm``: its declaration
        read, the availability kind's ``Sampling`` checked (a kind that does not describe itself,
        depends on the data or expects nobody is refused), the mechanism's needs of it checked
        (InputError naming the keys)."""
        p = cfg.privacy
        if p.mechanism == "none":
            return cls(p, None, cfg.rounds, cfg.seed, dim, world, m=cfg.task.clients, aggregation=cfg.aggregation)
        declared = declaration(algorithm, cfg.algorithm.name)
        if declared.counted:
            counted_refusals(cfg)
        sampling = sampling_of(cfg, participation)
        privacy = cls(p, sampling, cfg.rounds, cfg.seed, dim, world, amplified=declared.amplifiable,
                      m=cfg.task.clients, counted=declared.counted, aggregation=cfg.aggregation)
        privacy.mechanism.check(cfg, sampling, privacy.amplified)
        if p.amplification == "required" and not privacy.amplified:
            raise InputError(f"privacy.amplification: required, but {not_amplified(cfg, sampling, declared)}")
        privacy.amplification = (
            f"claimed ({sampling.kind.replace('_', '-')} sampling of availability.kind {cfg.availability.kind!r})"
            if privacy.amplified else
            "not claimed: privacy.amplification is off" if p.amplification == "off" else
            "not claimed: each client's releases are counted (an asynchronous server)" if declared.counted else
            f"not claimed: {not_amplified(cfg, sampling, declared)}")
        return privacy

    def notes(self) -> dict[str, str]:
        """Root attributes of the result file (rank 0): ``privacy_amplification``, whether the
        accountant claimed amplification by sampling and why (``fedmpi info`` shows it), and the
        mechanism's own (``Mechanism.notes``: banded_mf's factor, ``privacy_factor``)."""
        return {"privacy_amplification": self.amplification, **self.mechanism.notes()} if self.on else {}

    # ---------------------------------------------------------------- the noise's scale
    @property
    def cohort(self) -> float:
        """n~, the divisor of the noisy mean of a round."""
        return self.sampling.cohort

    @property
    def noise_scale(self) -> float:
        """n~ / N with ``privacy.noise_cohort_size`` N (the noise of a cohort of N), else 1."""
        n = self.params.noise_cohort_size
        return 1.0 if n is None else self.cohort / n

    @property
    def sigma_update(self) -> float:
        """sigma_u, the multiplier of the noise on the sum (sigma without adaptive clipping)."""
        return self.sigma if self.clipping is None else self.clipping.split(self.sigma)

    @property
    def C(self) -> np.float64:
        """The clip of the next release (0: none)."""
        return self.clipping.C if self.clipping is not None else np.float64(0.0)

    @property
    def noisy(self) -> bool:
        """Whether a release adds noise (not with sigma = 0)."""
        return self.on and self.sigma > 0

    # ---------------------------------------------------------------- a release
    def release(self, t: int, clients: np.ndarray, start: torch.Tensor, end: torch.Tensor,
                summed: Callable[[torch.Tensor], torch.Tensor], part: Part,
                contributors: np.ndarray | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Release t of a sum (every rank; collective as ``summed`` is): the rows' ``clients``
        updates end - start bounded and, with a local mechanism, noised (``client_side``); their sum
        ``summed(end)``; on rank 0 the central noise on its private ``part`` (``server_side``).
        Returns (the end models as summed, the sum: the noisy one on rank 0)."""
        end = self.client_side(t, clients, start, end)
        if self.on and self.mechanism.noise_at == "distributed":  # the clients' rows on the lattice, decoded
            lattice = self.mechanism.lattice(t, clients, part, float(self.clipping.C_used), float(self.sigma),
                                             self.cohort, self.world.is_server, secure=self.secure)
            total = summed(end, lattice)
            if self.world.is_server:
                self.ledger.record(contributors)
            return end, total
        total = summed(end) if self.secure is None else summed(end, self.secured(t, clients, part))
        if self.world.is_server:
            self.server_side(t, total, part, contributors)
        return end, total

    def secured(self, t: int, clients: np.ndarray, part: Part) -> Callable[..., torch.Tensor]:
        """Release t's sum by secure aggregation (``aggregation.kind: secagg``), in the shape of
        ``reproducible_sum_blocks`` (the reduction an algorithm's ``summed`` takes): the cohort gathered
        from the ranks' ``clients`` (collective), each coordinate in [-clip_range, clip_range]; under
        privacy the range is a row's bound C bound / divisor (``part``), which the rows keep room in."""

        def reduce(world: World, make_rows: Callable[[slice], torch.Tensor], n_local: int, n_total: int,
                   **_: Any) -> torch.Tensor:
            cohort = cohort_of(world, clients)
            limit = self.secure.params.clip_range
            if limit is not None:
                return self.secure.sum(t, cohort, clients, make_rows, limit)
            width = make_rows(slice(0, 0)).shape[-1]  # a clipped update's row has norm <= C bound / divisor
            _, bound, divisor = part(torch.zeros(width, dtype=torch.float64))
            norm = float(self.clipping.C_used) * bound / divisor
            return self.secure.sum(t, cohort, clients, make_rows, norm, norm=norm)

        return reduce

    def client_side(self, t: int, clients: np.ndarray, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """The clients' half of release t: the end models with their updates bounded
        (``Mechanism.bound``: ||Delta_i|| <= C) and, with a local mechanism, each client's own noise
        sigma_u C z_{t,i} added (every rank, its clients; collective with adaptive clipping)."""
        if not self.on:
            return end
        end = self.mechanism.bound(self.clipping, t, start, end)
        if self.noisy and self.mechanism.noise_at == "clients":
            z = self.mechanism.client_noise(t, clients, end.shape[1]).to(end.device)
            end = end + (z * float(self.sigma_update * self.clipping.C_used)).to(end.dtype)
        return end

    def server_side(self, t: int | None, total: torch.Tensor, part: Part = whole,
                    contributors: np.ndarray | None = None) -> torch.Tensor:
        """The server's half of release t (rank 0; None: the next counted release, the ledger's
        count): a central mechanism's noise added in place to the private ``part`` of ``total``, and
        the release recorded (with the clients whose updates it holds, where the ledger counts
        them). Returns ``total``."""
        t = self.ledger.releases if t is None else t
        if self.noisy and self.mechanism.noise_at == "server":
            view, bound, divisor = part(total)
            view += self.noise(t, view.shape[0], view.device, bound, divisor)
        self.ledger.record(contributors)
        return total

    def noise(self, t: int, dim: int, device: torch.device, bound: float = 1.0,
              divisor: float | None = None) -> torch.Tensor:
        """sigma_u C bound / divisor * y_t (y_t the mechanism's), float64, for a sum of s_i Delta_i with
        |s_i| <= bound / divisor (default: the mean, 1 / n~); rank 0, releases in order, only when ``noisy``."""
        y = self.mechanism.noise(t, dim).to(device)
        scale = self.sigma_update * self.clipping.C_used * bound / (self.cohort if divisor is None else divisor)
        return y * float(scale if self.params.noise_cohort_size is None else scale * self.noise_scale)

    # ---------------------------------------------------------------- accounting
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
        (``production``) of sigma, the noise of the production cohort of ``privacy.noise_cohort_size``.
        Counted releases (an asynchronous server): after those recorded so far (rank 0)."""
        sigma = float(self.sigma) if production else self.applied
        counted = self.ledger.counted
        k = self.ledger.most if counted else rounds
        if (sigma, k, counted) not in self._epsilons:
            self._epsilons[sigma, k, counted] = self._epsilon(sigma, k, counted)
        return self._epsilons[sigma, k, counted]

    def _epsilon(self, sigma: float, k: int, counted: bool) -> float:
        """Epsilon of ``k`` rounds of the kind's sampling, or (``counted``) of k releases charged to
        the most charged client: the mechanism's event on a pattern of k participations."""
        p = self.params
        sampling = Sampling("none", self.cohort, counted=(k, k)) if counted else self.sampling
        return accounting.epsilon(self.mechanism, sampling, self.amplified, sigma, k, p.delta, p.accountant)

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
        record = {} if self.secure is None else self.secure.record()
        if not self.on:
            return record
        return {"privacy/noise_multiplier": float(self.sigma), "privacy/applied_noise_multiplier": self.applied,
                **self.mechanism.record(), **record}

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
            y = probe.noise(t, 1) if probe.noise_at == "server" else probe.client_noise(t, np.zeros(1, np.int64), 1)
            if not bool(torch.isfinite(y).all()):
                raise InputError(f"privacy.mechanism: {name}'s noise is not finite in round {t}; a mechanism's "
                                 f"noise must be finite numbers (check its parameters)")

    def _check_accountant(self, rounds: int) -> None:
        """Epsilon after the run's rounds can be computed (kept for the last evaluation): else one line
        naming the key that set the noise, and what to change. Counted releases: as many as rounds.

        A floating-point warning of the accountant (a division by zero, an overflow: the multiplier's
        square or the lattice's variance underflowing to 0, e.g. 1e-300) is such a failure too: the
        epsilon it yields is no bound, and the warning would reach stderr."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)
                for production in (False, True) if self.production else (False,):
                    sigma = float(self.sigma) if production else self.applied
                    if self.ledger.counted:
                        self._epsilon(sigma, rounds, True)
                    else:
                        self.epsilon(rounds, production)
        except (ArithmeticError, ValueError, MemoryError, RuntimeWarning) as e:  # overflows at a tiny multiplier
            p = self.params
            key = ("privacy.noise_cohort_size" if self.production else "privacy.epsilon" if p.epsilon is not None
                   else "privacy.noise_multiplier")
            other = "use privacy.accountant: rdp, or more noise" if p.accountant != "rdp" else "give more noise"
            what = "floating point" if isinstance(e, RuntimeWarning) else type(e).__name__
            raise InputError(f"{key}: the noise applied (multiplier {self.applied:.3g}) is too small for "
                             f"privacy.accountant {p.accountant} to compose over {rounds} rounds "
                             f"({what}: {str(e)[:60]}); {other}") from None

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> State:
        """sigma and its ``components``' state: C, the mechanism's and the ledger's counts (none off)."""
        return super().state_dict() if self.on else State()

    def load_state_dict(self, state: State) -> None:
        if self.on:
            super().load_state_dict(state)


def counted_refusals(cfg: Any) -> None:
    """What counted releases (an asynchronous server) do not support, refused naming both keys."""
    p, name = cfg.privacy, cfg.algorithm.name
    if cfg.train.local_epochs is not None:
        raise InputError(f"train.local_epochs: with it a task of algorithm.name {name} (an asynchronous server) "
                         f"lasts comm_time + ceil(n_i E / B) x step_time, so which server step takes a client's "
                         f"update depends on its sample count n_i, its data, which privacy.mechanism cannot "
                         f"protect (give train.local_steps instead)")
    for key, on, why in (
            ("epsilon", p.epsilon is not None, "the releases each client joins are counted as the run goes (who "
                                               "arrives when), so no noise can be calibrated to them in advance: "
                                               "give privacy.noise_multiplier"),
            ("target_quantile", p.target_quantile is not None, "its releases are per server step, its updates' "
                                                               "bits per task: adaptive clipping is not accounted "
                                                               "there (give a fixed privacy.clip)"),
            ("noise_cohort_size", p.noise_cohort_size is not None, "its releases are buffers of its own size, "
                                                                   "not cohorts (leave it null)")):
        if on:
            raise InputError(f"privacy.{key}: algorithm.name {name} is an asynchronous server; {why}")


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
    if participation_decides_aborts(cfg.aggregation, sampling):
        return (f"aggregation.kind: secagg aborts a round whose cohort is too small, and under availability.kind "
                f"{kind!r} (Poisson sampling) whether a client took part can decide it, dropping the other "
                f"clients' rows: the amplified analysis does not cover that, so every participation is charged")
    return (f"privacy.mechanism {mechanism!r} has no amplified analysis for availability.kind {kind!r} "
            f"({sampling.kind.replace('_', '-')} sampling)")
