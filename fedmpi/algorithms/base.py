"""The algorithm contract and the shared server-round mechanism.

An algorithm is a subclass of ``Algorithm`` (or ``ServerAlgorithm``) registered with
``@register("name")`` -- the Flower "strategy" idea, with rank-aware state. It declares:

- ``Params``: the dataclass of its keys in the ``algorithm:`` block (a subclass of
  ``AlgorithmParams``), read as ``self.params``;
- ``sections``: the top-level config sections only it and its kin read (the decentralized
  family's ``topology`` and ``sporadicity``); with another algorithm they are ignored;
- ``needs_participation``: whether it runs on an availability model (``ctx.participation``);
- ``shared_state`` / ``client_state``: the attributes a checkpoint saves (``fedmpi.state``):
  shared = the same on every rank or the server's own (e.g. a momentum buffer), client = one
  row per client of the rank's shard; checkpoints and re-sharding follow from the declaration;
- ``evaluated_models`` (labels of the models ``evaluation_snapshot`` returns: ``""`` logs
  ``test_acc``/``test_loss``, ``"server"`` logs ``test_acc_server``...), ``metrics`` (its extra
  metric names) and ``client_rows`` (model-sized float32 rows kept per client, for the
  up-front memory check);
- ``clients_anywhere`` (``ServerAlgorithm``): nothing per client lives on its owner, so each
  cohort is split evenly over the ranks instead of by shard (``assigned``);
- ``derived``: attributes recomputed from the config, the task or the declared state (caches,
  scratch buffers, the last round's cohort);
- ``custom_state``: state its own ``state_dict`` extension saves (FedSWE's versions);
- ``components``: ``Stateful`` objects whose state is saved with its own, under the keys each names
  (the server's scheduler and privacy; ``fedmpi.state``);
- ``configuration``: attributes set-up fixes and no round reassigns (a rate, a count from the
  config; no arrays). Every attribute, scalars included, is state, derived or configuration: any
  other is refused at start, and again after the first round, because a checkpoint would not save
  it (``fedmpi.state.undeclared``), and so is a configuration attribute the first round reassigned
  (``fedmpi.state.changed_settings``);
- ``reads``: the keys of other sections it reads (``fedmpi.schema.Reads``), e.g. SCAFFOLD's
  ``train.momentum``; a value it does not support is refused naming both keys;
- ``private`` (``fedmpi.privacy.Private``): what client-level privacy needs to know of its release
  (with ``private_part``); undeclared, it is refused under ``privacy:``.

The runner calls (every "collective" method must be called on every rank, in the same order):

| method | ranks | collective | may change |
|---|---|---|---|
| ``check_config(cfg)`` (classmethod) | every rank, before set-up | no | nothing |
| ``__init__(ctx)`` | every rank | may be | everything |
| ``round(t)`` (or its phases, below), t = start, ..., T-1 in order | every rank | yes | its state |
| ``done()`` after each round | every rank; must agree | no | nothing |
| ``last_mask()`` after each round | rank 0 | no | nothing |
| ``round_record()`` at set-up and after each round | every rank | no | nothing |
| ``evaluation_snapshot()`` at each evaluation | every rank | yes | caches only |
| ``final_params()`` once, at the end | every rank | yes | caches only |
| ``static_groups()`` once, fresh runs only | rank 0 | no | nothing |
| ``virtual_time()`` at each evaluation (with a clock) | every rank | no | nothing |
| ``round_events()`` after each round (with a clock) | every rank | no | hands its events over |
| ``schedule()`` once, in ``__init__`` | every rank | no | nothing |
| ``state_dict()`` / ``load_state_dict(state)`` | every rank | no | load: its state |

``ServerAlgorithm`` is the centralized round (docs/DESIGN.md). Who is asked when, how long they take
and whom the server keeps is its scheduler's (``self.clock``, ``fedmpi.clock.scheduler``, made by
``schedule()``): availability asked per round or at virtual times, the clock, the durations and the
tasks in flight, one component with declared state. Synchronous rounds are one policy of it
(``Rounds``; untimed without ``clock:``, ``TimedRounds`` with it), asynchronous server steps the
other (``Steps``, ``algorithms.asynchronous``). Step 1's ``available`` is the scheduler's
``available(t)`` (round t's set, or the set at the virtual time the round starts). Its ``round(t)`` is three phases,
which a driver may call itself instead (``fedmpi.packed`` does, to train the clients of several
runs of a sweep at once), in this order, once per round, with nothing else of the algorithm
called in between; ``round(t)`` is exactly the three, so either way gives the same bits:

| phase (steps below) | ranks | collective | may change |
|---|---|---|---|
| ``begin_round(t)`` -> ``TrainingRequest`` (1-2) | every rank | no | per-round state (``select``) |
| training: ``local_phase(request)`` -> end models (3) | every rank | no (an override: may be) | client state |
| ``finish_round(request, end)`` (3b-8) -> clients that trained | every rank | yes | its state |

The request holds the round ``t``, ``active`` and the rank's ``clients`` (``local``) with their
``start`` models; when the class keeps the default ``local_training`` (``trains_by_default()``)
it also holds the trainer's other inputs (``lr_scale``, ``terms``, ``stats`` to fill), so that
the training phase is ``ctx.trainer.run(request)``, which a driver may replace by any trainer that
gives each client the same rows (``engine.packed.PackedTrainer`` does). ``end`` holds one row per
client of ``request.clients``, in that order.

Inside ``round(t)``:

| step | ranks | what it may do |
|---|---|---|
| 1. ``select(t, available)`` | every rank, once per round, same input | update replicated per-round state |
| 1b. whom the scheduler keeps (``self.clock.keep``); ``failures(t, failed, late)`` | every rank | -- |
| 2. ``start_models``, ``lr_scale``, ``local_terms`` | every rank, its active clients (``assigned``) | read state |
| 3. ``local_training(t, local, start)`` (default: ``ctx.trainer`` with ``local_terms``) | every rank | client state |
| 3b. privacy's release begins: updates bounded (clip), local noise | every rank; adaptive: collective | its C |
| 3c. ``self.outputs``: all active clients' ``ClientOutputs`` (if ``client_outputs``) | collective | -- |
| 4. ``contribution(...)`` (default ``weights``) | every rank, on blocks, twice each | nothing: pure |
| 5. one reproducible sum of the rows into rank 0 | collective | -- |
| 5b. the release ends: central noise on ``private_part(t, total)``, the ledger | rank 0 only | nothing: pure |
| 6. ``server_update(t, active, total)`` -> x^{t+1} | rank 0 only | server state |
| 7. broadcast of x^{t+1} | collective | -- |
| 8. ``after_round(t, active, local, start, end)`` | every rank | client and replicated state |

Step 5 gives the same bits whatever the number of ranks (``engine.reduce``). Subclasses
override only the steps their paper changes, so each algorithm file reads like its definition.
Every hook of this table (``HOOKS``, and the switches ``SWITCHES``) is honoured by the mode the
class runs in, or refused at ``register`` with one line naming the hook and the mode
(``ServerAlgorithm._unhonoured``; the asynchronous server's list is ``asynchronous.HONOURED``).

Per-client outputs (a class that declares ``client_outputs = True``): from step 3c on,
``self.outputs`` (``ClientOutputs``) holds every active client's mean training loss, its loss at
the start model, its steps, ||Delta_i||^2 (when the class declares ``delta_norms``) and its
sample count, the same bits on every rank; steps 4-8
read it, and so does ``select`` of the next round (None before the first round of a process: it
is not checkpointed, so an algorithm that needs it across rounds keeps what it needs in its
declared state). ``outputs.sum(values)`` sums per-client numbers reproducibly
(``engine.reduce.client_sum``). A class that declares ``client_quantities``
(``engine.quantities.ClientQuantity``, e.g. ``MEAN_SQUARED_LOSS``) gets each one, computed from the
per-sample losses of local training, in ``self.outputs.extra[name]``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable

import numpy as np
import torch

from ..clock import scheduler
from ..engine.local_step import StepTerm
from ..engine.local import LocalStats, Training
from ..engine.quantities import ClientQuantity, check_quantities
from ..engine.reduce import client_sum, gather_clients, reproducible_sum_blocks
from ..engine.threads import one_thread
from ..errors import InputError
from ..privacy.declaration import Private
from ..privacy.run import Privacy
from ..registry import ALGORITHMS
from ..schema import Digest, Reads, opt
from ..state import Stateful, declared, state_tensors

if TYPE_CHECKING:
    from ..config import Config
    from ..engine.local import LocalTrainer
    from ..engine.params import ParamSpec
    from ..participation import Participation
    from ..runtime import World
    from ..task import Task


@dataclass
class AlgorithmParams:
    """The ``algorithm`` block: ``name``, then the chosen algorithm's own parameters (a subclass)."""

    name: str = opt("fedavg_active", "the algorithm", selects=ALGORITHMS)


@dataclass
class ServerParams(AlgorithmParams):
    """The keys of every centralized algorithm (a ``ServerAlgorithm``): its parameters extend these."""

    global_lr: float = opt(1.0, "eta_g, the server's learning rate (was train.global_lr)", gt=0,
                           digest=Digest(at="train.global_lr", default=1.0))  # hashed where it was declared


@dataclass
class Context:
    """What an algorithm may use: config, world, task, trainer, participation, privacy.

    ``cfg`` is the run's config as the algorithm may read it (``capabilities.scoped``): its
    ``algorithm`` block, its ``sections`` and the keys of other sections it declares (``reads``,
    ``uses``); another key raises at its first read, naming the key and the fix. Components that
    own a section (trainer, participation, privacy, clock) get theirs from the root config;
    ``build.Components`` (the runner's) holds the root."""

    cfg: Config  # the run's resolved config, scoped to the algorithm (``capabilities.ScopedConfig``)
    world: World  # ranks, devices and the collectives (``fedmpi.runtime``)
    task: Task  # the data on this rank's device, the model, the clients' shares (``fedmpi.task``)
    trainer: LocalTrainer  # local training of many clients at once (``engine.local``)
    participation: Participation | None  # the availability model (None for an algorithm without one)
    privacy: Privacy | None = None  # the run's privacy (``fedmpi.privacy.run``): the releases of sums, epsilon

    @property
    def m(self) -> int:
        """The number of clients."""
        return self.task.m

    @property
    def spec(self) -> ParamSpec:
        """The model's layout (``engine.params.ParamSpec``): flat rows <-> named parameters."""
        return self.trainer.spec

    @property
    def shard(self) -> tuple[int, int]:
        """[lo, hi): the client ids this rank owns."""
        return self.world.shard(self.m)

    @property
    def device(self) -> torch.device:
        """This rank's device (models and data live there)."""
        return self.world.device

    def local(self, ids: np.ndarray) -> np.ndarray:
        """The ids of ``ids`` owned by this rank."""
        lo, hi = self.shard
        return ids[(ids >= lo) & (ids < hi)]


@dataclass
class Snapshot:
    """What an algorithm offers at an evaluation: models to test (label -> flat model, read on
    rank 0) and scalar metrics (final on rank 0)."""

    models: dict[str, torch.Tensor]
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class ClientOutputs:
    """Per-client outputs of a round's local training: one entry per active client, in the order
    of ``ids``, float64 numpy arrays, the same on every rank (``ServerAlgorithm.round`` step 3c).

    ``loss``: the mean of its minibatch training losses over its local steps; ``first_loss``: the
    minibatch loss of its first step (at its start model: an unbiased estimate of F_i(x^t) when
    it starts from x^t); ``steps``: local steps it did (tau_i); ``delta_sq``: ||Delta_i||^2 (after
    privacy clipping; NaN unless the algorithm declares ``delta_norms``); ``samples``: its number
    of training samples n_i; ``extra``: the algorithm's ``client_quantities`` by name (NaN for a
    client whose training did not fill them: an own ``local_training`` that ignores ``self.stats``)."""

    ids: np.ndarray
    loss: np.ndarray
    first_loss: np.ndarray
    steps: np.ndarray
    delta_sq: np.ndarray
    samples: np.ndarray
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def gather(cls, world: World, ids: np.ndarray, local: np.ndarray, stats: LocalStats, delta_sq: np.ndarray,
               sizes: np.ndarray) -> ClientOutputs:
        """Collective: every rank gives its ``local`` clients' numbers; every rank gets all of ``ids``."""
        n = len(local)
        nan = np.full(n, np.nan)
        filled = stats.loss is not None
        names = [q.name for q in stats.quantities]
        rows = np.stack([stats.loss if filled else nan, stats.first_loss if filled else nan,
                         stats.steps if filled else np.zeros(n), delta_sq, sizes[local],
                         *(stats.extra.get(k, nan) for k in names)], 1) if n else np.zeros((0, 5 + len(names)))
        cols = gather_clients(world, ids, local, rows).T
        return cls(np.asarray(ids), *cols[:5], extra=dict(zip(names, cols[5:])))

    def at(self, clients: np.ndarray) -> np.ndarray:
        """Positions of ``clients`` (a subset of ``ids``) in the arrays."""
        sorter = np.argsort(self.ids, kind="stable")
        return sorter[np.searchsorted(self.ids, clients, sorter=sorter)]

    @staticmethod
    def sum(values: np.ndarray) -> float:
        """Reproducible sum of per-client numbers (correctly rounded: no order, no rank count matters)."""
        return client_sum(values)


@dataclass
class TrainingRequest(Training):
    """A round's local-training phase (``ServerAlgorithm.begin_round``): the trainer's inputs
    (``engine.local.Training``: ``start``, ``clients``, ``t``, and ``lr_scale``, ``terms``,
    ``stats`` when the class trains by default) and the round's active clients."""

    active: np.ndarray | None = None  # A_t, the same on every rank

    @property
    def local(self) -> np.ndarray:
        """The active clients this rank trains (``clients``)."""
        return self.clients


def local_work(steps: np.ndarray, momentum: float) -> np.ndarray:
    """||a_i||_1, how many steps' worth of gradient a client's change holds: its steps tau_i, or with
    local momentum rho (tau_i - rho (1 - rho^tau_i) / (1 - rho)) / (1 - rho), the sum of the weights
    its momentum buffer gives the step directions (FedNova, Wang et al. 2020). Delta_i / (eta_l a_i)
    is then client i's mean step direction."""
    rho = momentum
    return (steps - rho * (1 - rho ** steps) / (1 - rho)) / (1 - rho) if rho else steps


class Algorithm(Stateful):
    """Base of every algorithm; the contract is in the module docstring."""

    Params: type[AlgorithmParams] = AlgorithmParams
    sections: tuple[str, ...] = ()  # top-level config sections of its own (e.g. ``topology``)
    reads: tuple[Reads, ...] = ()  # keys of other sections it reads (``fedmpi.schema.Reads``)
    needs_participation: bool = False
    #: labels of the models ``evaluation_snapshot`` returns: ``""`` logs ``test_acc``/``test_loss``,
    #: ``"server"`` logs ``test_acc_server``...
    evaluated_models: tuple[str, ...] = ("",)
    metrics: tuple[str, ...] = ()  # the names of its own metrics (``Snapshot.metrics``)
    client_rows: int = 0  # model-sized float32 rows it keeps per client (for the up-front memory check)
    #: what privacy needs to know (``fedmpi.privacy.Private``), why it cannot apply (a string), or
    #: None: nothing declared (refused under ``privacy:``)
    private: Private | str | None = None
    configuration = ("ctx", "cfg", "params", "world", "m")  # fixed at set-up (``fedmpi.state``)
    #: keys of other sections it reads, whatever their value (``algorithms.capabilities``): every
    #: random stream is keyed by the seed
    uses: tuple[str, ...] = ("seed",)

    def __init__(self, ctx: Context):
        self.ctx = ctx
        self.cfg = ctx.cfg
        self.params = ctx.cfg.algorithm
        self.world = ctx.world
        self.m = ctx.m

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        """Cross-key checks of a config that selects this algorithm (raise InputError)."""
        if not cls.needs_participation and cfg.availability.kind != "always":
            raise InputError(f"availability.kind: algorithm {cfg.algorithm.name!r} does not use availability "
                             f"(leave availability.kind: always)")
        step = getattr(cls, "own_server_step", None)
        if step is not None and cfg.algorithm.global_lr != 1.0:
            raise InputError(f"algorithm.global_lr: {cfg.algorithm.name} {step} (leave it at 1), "
                             f"got {cfg.algorithm.global_lr}")
        if cfg.clock.on and not issubclass(cls, ServerAlgorithm):
            raise InputError(f"clock.kind: algorithm.name {cfg.algorithm.name} is decentralized (its delays are "
                             f"sporadicity's); the clock times a server's rounds (leave clock.kind: none)")

    def round(self, t: int) -> int:
        """Run round (iteration) t; return the number of clients that trained (the same on every rank)."""
        raise NotImplementedError

    def done(self) -> bool:
        """True to stop before ``rounds`` (e.g. a delay budget)."""
        return False

    def last_mask(self) -> np.ndarray | None:
        """The ids that participated in the last round (for /availability/mask)."""
        return None

    def round_record(self) -> dict[str, float]:
        """Numbers of the last round for the result file ({dataset path: value}, one row per round;
        the same names at set-up, which creates the datasets)."""
        return {}

    def evaluation_snapshot(self) -> Snapshot:
        """The models to test (labels ``evaluated_models``) and the extra ``metrics``."""
        raise NotImplementedError

    def final_params(self) -> torch.Tensor:
        """The final model written to /final/params (rank 0 writes it)."""
        return self.evaluation_snapshot().models[""]

    def static_groups(self) -> dict[str, dict[str, np.ndarray]]:
        """Result-file groups written once at the start, e.g. {'topology': {'edges': ...}}."""
        return {}

    def virtual_time(self) -> float | None:
        """Virtual seconds since the start (the metric ``time``), or None without a clock."""
        return None

    def round_events(self) -> dict[str, np.ndarray] | None:
        """The clock's events of the last round (``fedmpi.clock.events``), handed over once, for
        ``/events``; None without a clock."""
        return None


#: the hooks of the round (the table of the module docstring) an algorithm may override
HOOKS = ("select", "failures", "start_models", "lr_scale", "local_terms", "local_training", "contribution",
         "weights", "private_part", "server_update", "after_round")
#: the switches that ask the round for more (per-client outputs, norms, quantities)
SWITCHES = ("client_outputs", "delta_norms", "client_quantities")


class ServerAlgorithm(Algorithm):
    """Centralized FL with rank 0 as the server; see the module docstring."""

    Params = ServerParams
    needs_participation = True
    shared_state = ("x",)
    derived = ("active", "_sizes", "_outputs", "stats")  # the last round's cohort and outputs; sample counts
    components = ("clock", "privacy")  # saved with its state: the scheduler (clock.*, flight.*), privacy (privacy.*)
    configuration = ("eta_g",)
    #: the clock's keys (its rounds' durations and cuts), K of a cohort under over-selection, the batch
    #: a device map's durations are measured at, the availability kind its refusal names
    uses = ("clock", "availability.size", "availability.kind", "train.batch_size")
    #: True: ``self.outputs`` holds this round's ``ClientOutputs`` (one small collective a round:
    #: ~1 ms of a 2-rank anchor-task round, so only algorithms that read them pay it)
    client_outputs = False
    #: True: it reads the true availability probabilities p_i^t (``Participation.probabilities``), so
    #: kinds that do not give them (markov, trace) are refused at start
    needs_probabilities = False
    #: True (implies ``client_outputs``): ``self.outputs.delta_sq`` holds ||Delta_i||^2 (one more
    #: pass over the updates, ~2.5% of an anchor-task round: benchmarks/RESULTS.md); False: NaN
    delta_norms = False
    #: per-client quantities of local training (``engine.quantities.ClientQuantity``; implies
    #: ``client_outputs``): ``self.outputs.extra[name]``; the trainer keeps every per-sample loss
    #: only when some are declared (benchmarks/RESULTS.md)
    client_quantities: tuple[ClientQuantity, ...] = ()
    #: True: a client's part of the round (steps 2-4 and 8) reads only replicated state and the
    #: client's id, so any rank may train it, and the round splits the active clients evenly over
    #: the ranks by position instead of by shard (a random cohort splits unevenly by shard and the
    #: ranks wait for the larger share: 8% of a 2-rank anchor-task round, benchmarks/RESULTS.md).
    #: Refused at ``register`` beside ``client_state``, which lives on the owning rank. Either way
    #: the same bits (each client's training is its own; the sum is exact).
    clients_anywhere = False
    #: why it sets its own server step (e.g. "sets its own server step size"): then
    #: ``algorithm.global_lr`` must stay 1; None: eta_g applies
    own_server_step: str | None = None

    def __init__(self, ctx: Context):
        super().__init__(ctx)
        if self.needs_probabilities and ctx.participation.probabilities(0) is None:
            raise InputError(f"availability.kind: {self.cfg.algorithm.name} needs the true p_i^t, which "
                             f"{self.cfg.availability.kind!r} does not give (Participation.probabilities: the "
                             f"Bernoulli kinds, always and cohort do)")
        self.eta_g = self.params.global_lr
        self.x = ctx.spec.flatten(ctx.task.model).to(ctx.device)  # x^t, identical on every rank
        self.active = np.zeros(0, dtype=np.int64)
        self._outputs: ClientOutputs | None = None  # this round's (from step 3c), else the last round's
        self._sizes = np.asarray(ctx.task.sizes, dtype=np.float64)
        self.privacy = ctx.privacy  # a sum the server releases goes through it (``finish_round``)
        self.clock = self.schedule()  # who is asked when and whom the server keeps

    @classmethod
    def check_config(cls, cfg: Config) -> None:
        super().check_config(cfg)
        scheduler.check(cfg, cls)

    def schedule(self) -> scheduler.Scheduler:
        """The server's scheduler (``fedmpi.clock.scheduler``): synchronous rounds, untimed without
        ``clock:`` (``Rounds``), else on the clock (``TimedRounds``)."""
        return scheduler.rounds(self.ctx)

    # ---------------------------------------------------------------- the round
    def round(self, t: int) -> int:
        """Round t: ``begin_round``, the local-training phase, ``finish_round`` (the phases'
        contract is in the module docstring; a packed sweep runs the middle one for several runs
        at once)."""
        request = self.begin_round(t)
        return self.finish_round(request, self.local_phase(request))

    def begin_round(self, t: int) -> TrainingRequest:
        """Steps 1-2 of round t (every rank): who trains, from which models and, with the default
        training (``trains_by_default``), with which step sizes, terms and stats to fill."""
        selected = self.select(t, self.clock.available(t))
        cohort = self.clock.keep(t, selected)  # 1b: whom the clock keeps (deadline, over-selection, dropout)
        if len(cohort.failed) or len(cohort.late):
            self.failures(t, cohort.failed, cohort.late)
        self.active = active = cohort.kept
        local = self.assigned(active)
        start = self.start_models(local)
        self.stats = LocalStats(quantities=self.client_quantities)  # filled by the local training
        request = TrainingRequest(start, local, t, active=active)
        if self.trains_by_default():  # the trainer's whole input: a packed sweep trains it with others'
            wanted = self.reads_outputs()  # the losses cost ~6% of a round: only when read
            request.lr_scale = self.lr_scale(t, local)
            request.terms = tuple(self.local_terms(t, local, start))
            request.stats = self.stats if wanted else None
        return request

    def local_phase(self, request: TrainingRequest) -> torch.Tensor:
        """Step 3: the end models of ``request``'s clients (every rank, its clients): the trainer on
        the request, or the class's own ``local_training``."""
        if self.trains_by_default():
            return self.ctx.trainer.run(request)
        return self.local_training(request.t, request.local, request.start)

    def finish_round(self, request: TrainingRequest, end: torch.Tensor) -> int:
        """Steps 3b-8 of ``request``'s round from the end models ``end`` (collective); returns the
        number of clients that trained (the same on every rank)."""
        t, active, local, start = request.t, request.active, request.local, request.start

        def summed(end: torch.Tensor, reduce: Callable = reproducible_sum_blocks) -> torch.Tensor:
            # steps 3c-5 on the bounded (privacy) end models; ``reduce``: distributed DP's lattice sum
            if self.reads_outputs():
                norms = self._delta_sq(start, end) if self.delta_norms else np.full(len(local), np.nan)
                self._outputs = ClientOutputs.gather(self.world, active, local, self.stats, norms, self._sizes)
            return reduce(  # one reduction; rows made block by block to bound memory
                self.world, lambda s: self._owned(self.contribution(t, active, local[s], start[s], end[s]), start,
                                                  end), len(local), len(active), overwrite=True)

        # privacy: the round is one release of the sum (bounded updates, the mechanism's noise: fedmpi.privacy)
        end, buf = self.privacy.release(t, local, start, end, summed, lambda total: self.private_part(t, total))
        # x^{t+1} goes into a fresh tensor on every rank: ``start`` may view x^t
        self.x = self.server_update(t, active, buf).float() if self.world.is_server else torch.empty_like(self.x)
        self.world.broadcast_(self.x)
        self.after_round(t, active, local, start, end)
        return len(active)

    def reads_outputs(self) -> bool:
        """Whether ``self.outputs`` is gathered: the class declares ``client_outputs``,
        ``delta_norms`` or ``client_quantities``."""
        return bool(self.client_outputs or self.delta_norms or self.client_quantities)

    @classmethod
    def trains_by_default(cls) -> bool:
        """True when the class keeps the default ``local_training`` (the trainer with ``lr_scale``,
        ``local_terms`` and ``stats``): then its training phase is fully described by the
        ``TrainingRequest``, and a packed sweep may train it together with other runs'."""
        return cls.local_training is ServerAlgorithm.local_training

    @staticmethod
    def _delta_sq(start: torch.Tensor, end: torch.Tensor) -> np.ndarray:
        """||Delta_i||^2 per row, row by row: the same bits whatever the block (``vector_norm`` is
        4x ``vecdot``'s speed on the anchor task)."""
        with one_thread(end.device):
            return torch.linalg.vector_norm(end - start, dim=1).double().pow_(2).cpu().numpy()

    @property
    def outputs(self) -> ClientOutputs | None:
        """This round's ``ClientOutputs`` (from step 3c; the last round's in ``select``; None before
        the first round of a process). Only for a class that declares ``client_outputs = True``."""
        if not self.reads_outputs():
            raise TypeError(f"{type(self).__name__}: declare client_outputs = True to read self.outputs "
                            f"(the per-client gather costs a collective a round, so it is opt-in)")
        return self._outputs

    @outputs.setter
    def outputs(self, value: ClientOutputs | None) -> None:
        self._outputs = value

    def assigned(self, active: np.ndarray) -> np.ndarray:
        """The active clients this rank trains (every rank, with the same ``active``): an even
        share by position when ``clients_anywhere`` applies, else those it owns (``ctx.local``)."""
        if not self.clients_anywhere:  # (beside client_state it is refused at register)
            return self.ctx.local(active)
        n, r, size = len(active), self.world.rank, self.world.size
        return active[n * r // size: n * (r + 1) // size]

    @classmethod
    def _unhonoured(cls) -> str | None:
        """Why ``cls`` overrides a hook or sets a switch its mode would ignore (one line naming the
        hook and the mode; refused at ``register``), or None. The synchronous round honours every
        hook of ``HOOKS``; ``clients_anywhere`` cannot apply beside ``client_state`` (a client's
        rows live on its owner's rank)."""
        if cls.clients_anywhere and declared(cls, "client_state"):
            return (f"{cls.__name__}.clients_anywhere: the synchronous round ignores it beside client_state "
                    f"(a client's rows live on the rank that owns it): set clients_anywhere = False")
        return None

    @classmethod
    def _overridden(cls) -> list[str]:
        """The hooks of ``HOOKS`` and switches of ``SWITCHES`` that ``cls`` changes from
        ``ServerAlgorithm``'s."""
        hooks = [h for h in HOOKS if getattr(cls, h) is not getattr(ServerAlgorithm, h)]
        return hooks + [s for s in SWITCHES if getattr(cls, s)]

    # ---------------------------------------------------------------- hooks
    def select(self, t: int, available: np.ndarray) -> np.ndarray:
        """Which available clients train this round (default: all of them).

        Called exactly once per round, on every rank, with the same ``available``: it may
        update replicated per-round state (F3AST's rates, debiased FedAvg's counts)."""
        return available

    def failures(self, t: int, failed: np.ndarray, late: np.ndarray) -> None:
        """Step 1b (with a clock, every rank): of the clients ``select`` chose in round t, those
        whose task failed (``clock.dropout``) and those dropped as stragglers (``clock.deadline``);
        they do not train and are not in A_t. Default: nothing more (each algorithm's file and
        docs/ALGORITHMS.md say what it does with them)."""

    def start_models(self, local: np.ndarray) -> torch.Tensor:
        """Starting models of the local active clients (default: x^t for each)."""
        return self.x.expand(len(local), -1)

    def lr_scale(self, t: int, local: np.ndarray) -> torch.Tensor | None:
        """Factors (n,) of each local active client's step size (default None: all 1)."""
        return None

    def local_terms(self, t: int, local: np.ndarray, start: torch.Tensor) -> tuple[StepTerm, ...]:
        """The algorithm's own terms of every local step (``engine.local_step.StepTerm``), e.g.
        FedProx's proximal term, SCAFFOLD's correction (default: none)."""
        return ()

    def local_training(self, t: int, local: np.ndarray, start: torch.Tensor) -> torch.Tensor:
        """End models of the local active clients after their local steps from ``start``
        (default: ``ctx.trainer.train`` with ``lr_scale`` and ``local_terms``), filling
        ``self.stats`` (``engine.local.LocalStats``, fresh each round) for ``self.outputs`` when the
        class declares ``client_outputs``; an override that does not fill it leaves its clients'
        losses NaN and steps 0."""
        wanted = self.reads_outputs()  # the losses cost ~6% of a round: only when read
        return self.ctx.trainer.train(start, local, t, lr_scale=self.lr_scale(t, local),
                                      terms=self.local_terms(t, local, start), stats=self.stats if wanted else None)

    def contribution(self, t: int, active: np.ndarray, local: np.ndarray,
                     start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """One float64 row per listed local client, summed over all clients for the server.

        Called on blocks of the local clients, twice each: it must not change any state. The
        reduction pre-rounds the rows in place unless they share memory with ``start``, ``end``
        or a tensor the algorithm holds (``_owned``), so an override may return rows it keeps.
        Default: w_i Delta_i with w_i from ``weights``."""
        w = torch.as_tensor(self.weights(t, active, local), dtype=torch.float64, device=end.device)
        return (end - start).double().mul_(w[:, None])  # in place: one float64 temporary fewer

    def _owned(self, rows: torch.Tensor, *models: torch.Tensor) -> torch.Tensor:
        """``rows``, or a copy when they share memory with ``models``, the declared state or a
        tensor attribute of the algorithm: the reduction rounds float64 rows in place (float32
        rows are converted, a copy anyway)."""
        if rows.dtype != torch.float64:
            return rows
        held = [v for v in vars(self).values() if isinstance(v, torch.Tensor)]
        kept = {t.untyped_storage().data_ptr() for t in (*models, *state_tensors(self), *held)}
        return rows.clone() if rows.untyped_storage().data_ptr() in kept else rows

    def weights(self, t: int, active: np.ndarray, local: np.ndarray) -> np.ndarray:
        """Weight w_i of each local active client's change Delta_i (used by ``contribution``)."""
        raise NotImplementedError

    def cohort(self, active: np.ndarray) -> float:
        """The divisor of a mean over the active clients: their number (at least 1), or under
        privacy the fixed expected cohort n~ (the realised count would reveal who took part)."""
        return self.privacy.cohort if self.privacy.on else max(len(active), 1)

    # ---------------------------------------------------------------- privacy hook
    def private_part(self, t: int, total: torch.Tensor) -> tuple[torch.Tensor, float, float]:
        """The view of the summed buffer that holds sum_i s_i Delta_i over the clipped updates
        Delta_i (``end - start``), and (bound, divisor) with |s_i| <= bound / divisor for every
        client: ``fedmpi.privacy`` adds noise of std sigma C bound / divisor to that view, in place.
        Declared with the ``contribution`` it describes (``private``). Default: all of it,
        s_i = w_i = 1 / n~ (the base ``contribution`` with ``weights`` 1 / ``cohort(active)``)."""
        return total, 1.0, self.privacy.cohort

    def server_update(self, t: int, active: np.ndarray, total: torch.Tensor) -> torch.Tensor:
        """x^{t+1} from the summed buffer (rank 0 only). Default: x^t + eta_g * total."""
        return (self.x.double() + self.eta_g * total)

    def after_round(self, t: int, active: np.ndarray, local: np.ndarray,
                    start: torch.Tensor, end: torch.Tensor) -> None:
        """After the broadcast of x^{t+1}: update client state of ``local`` (from ``start``, ``end``)
        and replicated state (e.g. from ``self.outputs``), the same on every rank (default: nothing)."""

    # ---------------------------------------------------------------- outputs
    def round_record(self) -> dict[str, float | np.ndarray]:
        """Under privacy the noise multipliers of the round (``Privacy.round_record``); for each
        ``client_quantities`` entry with ``store``, ``client_rounds/<name>``: its value for every
        client that trained this round, NaN for the others (m float64; all NaN at set-up)."""
        record: dict[str, float | np.ndarray] = dict(self.privacy.round_record())
        for q in self.client_quantities:
            if q.store:
                row = record[f"client_rounds/{q.name}"] = np.full(self.m, np.nan)
                if self._outputs is not None:
                    row[self._outputs.ids] = self._outputs.extra[q.name]
        return record

    def evaluation_snapshot(self) -> Snapshot:
        return Snapshot({"": self.x})

    def final_params(self) -> torch.Tensor:
        return self.x

    def last_mask(self) -> np.ndarray:
        return self.active

    def virtual_time(self) -> float | None:
        return self.clock.virtual_time()

    def round_events(self) -> dict[str, np.ndarray] | None:
        return self.clock.round_events()


def register(name: str) -> Callable[[type[Algorithm]], type[Algorithm]]:
    """Class decorator: ``@register("fedavg_active") class FedAvgActive(ServerAlgorithm)``; the
    class's ``Params`` and ``check_config`` validate the ``algorithm:`` block, its ``sections``
    are the top-level sections it reads (others' are ignored with a notice)."""

    def deco(cls: type[Algorithm]) -> type[Algorithm]:
        if not (isinstance(cls, type) and issubclass(cls, Algorithm)):
            raise TypeError(f"algorithm {name!r}: register a subclass of fedmpi.algorithms.Algorithm")
        from .capabilities import check  # (it reads this module's classes)

        check(cls, name)  # declarations that contradict each other
        if issubclass(cls, ServerAlgorithm):
            check_quantities(cls.__name__, cls.client_quantities)
            why = cls._unhonoured()  # a hook its mode would silently ignore
            if why is not None:
                raise TypeError(f"algorithm {name!r}: {why}")
        elif getattr(cls, "client_quantities", ()):
            raise TypeError(f"{cls.__name__}.client_quantities: only a ServerAlgorithm's round gathers them")
        return ALGORITHMS.register(name, params=_params_of(cls), check=cls.check_config, sections=cls.sections,
                                   reads=cls.reads)(cls)

    return deco



def _params_of(cls: type[Algorithm]) -> type[AlgorithmParams]:
    """``cls.Params``; for a server algorithm whose ``Params`` extend only ``AlgorithmParams`` (a
    plug-in written before ``ServerParams``), those plus the server's keys."""
    if not issubclass(cls, ServerAlgorithm) or issubclass(cls.Params, ServerParams):
        return cls.Params
    return dataclass(type(cls.Params.__name__, (cls.Params, ServerParams), {"__module__": cls.Params.__module__}))
