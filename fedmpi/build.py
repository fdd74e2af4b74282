"""``build_components(cfg, world)``: the components of one run, built the same way by the runner, the
tests and the benchmarks -- task (data + model), local trainer, participation model, privacy,
algorithm.

``build_task(cfg, device)`` gets the arrays of the dataset named by ``task.dataset`` (a
registered factory, ``fedmpi.data.datasets``), splits them over the clients (``partition``),
builds the model named by ``task.model`` (``fedmpi.models``) and puts the training and test
tensors on ``device``.

Every rank builds the same components for its shard of clients; nothing here communicates
except what the algorithm's constructor does. Bad input raises ``InputError`` (the runner
makes every rank agree on it).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import operator
from dataclasses import dataclass, field

import numpy as np
import torch

from . import guards, rng
from .algorithms.base import Algorithm, Context
from .algorithms.capabilities import scoped
from .clock.params import asked
from .config import Config
from .data.arrays import DataArrays
from .data.datasets import checked_arrays, dataset_arrays
from .data.partition import (client_groups, label_histogram, natural_parts, natural_test_parts, partition,
                             split_local_test)
from .engine.local import LocalTrainer
from .engine.params import frozen_bytes
from .errors import InputError
from .models import build_model, loss_fn
from .models.losses import TokenLoss, mse
from .models.pretrained import initialise
from .participation import AvailabilityParams, ClientInfo
from .participation import Participation
from .participation import build as build_participation
from .privacy.run import Privacy
from .registry import ALGORITHMS, MECHANISMS
from .runtime import World
from .state import changed_settings, declared, settings, state_value, undeclared
from .task import Task

log = logging.getLogger(__name__)


@dataclass
class Components(Context):
    """The components of one run on this rank: the algorithm's ``Context`` and the algorithm."""

    algorithm: Algorithm | None = None
    #: the configuration attributes of the algorithm and availability model at set-up, by key
    #: (``check_state`` records them, then refuses a change)
    settings: dict[str, dict] = field(default_factory=dict)


def build_components(cfg: Config, world: World, participation: Participation | None = None,
                     task: Task | None = None) -> Components:
    """Build every component of ``cfg`` on this rank; ``participation`` and ``task`` replace the
    configured ones (tests script who is available, benchmarks bring synthetic tasks)."""
    task = task if task is not None else build_task(cfg, world.device)
    trainer = LocalTrainer(task, cfg.train, cfg.seed)
    cls = ALGORITHMS.get(cfg.algorithm.name).obj
    if participation is None and cls.needs_participation:
        participation = build_participation(asked_availability(cfg), task.client_info(cfg.seed, cfg.rounds))
    held = check_memory(cfg, world, task.m, trainer.spec.dim, task, trainer.path, trainer)
    if task.text is not None or frozen_bytes(task.model):
        log.info(memory_line(trainer, world, held))
    check_step_inputs(cfg, world, trainer)
    privacy = Privacy.of_run(cfg, participation, cls, trainer.spec.dim, world)  # the releases the server asks for
    components = Components(cfg, world, task, trainer, participation, privacy)
    components.algorithm = cls(Context(scoped(cfg, cls), world, task, trainer, participation, privacy))  # its keys only
    check_state(components)
    return components


def asked_availability(cfg: Config) -> AvailabilityParams:
    """``cfg.availability``, with a cohort of K drawing ceil((1 + f) K) clients under
    ``clock.over_select`` f (the clock keeps the first K to report: ``fedmpi.clock.rounds``)."""
    f = cfg.clock.over_select
    return dataclasses.replace(cfg.availability, size=asked(cfg.availability.size, f)) if f > 0 else cfg.availability


def check_state(run: Components) -> None:
    """Refuse an algorithm or availability model holding an attribute that is neither declared state,
    derived nor configuration, or a configuration attribute holding an array or tensor
    (``fedmpi.state.undeclared``), or, after the first call, one whose configuration attribute
    changed since (``fedmpi.state.changed_settings``): a checkpoint would not save it, and a resumed
    run would silently differ; and declared state a checkpoint cannot hold (``fedmpi.state.state_value``:
    a string, None, an int beyond 64 bits). Called after set-up and after the first round."""
    for key, name, component in (("algorithm.name", run.cfg.algorithm.name, run.algorithm),
                                  ("availability.kind", run.cfg.availability.kind, run.participation)):
        if component is None:
            continue
        found = undeclared(component)
        if found:
            value = operator.attrgetter(found[0])(component)
            what = ("an array or tensor declared configuration" if found[0] in settings(component)
                    else "an attribute that is neither declared state, derived nor configuration")
            raise InputError(f"{key}: {name} keeps {found[0]!r} ({type(value).__name__}, "
                             f"{type(component).__name__}), "
                             f"{what}, so a checkpoint would lose it: list it in shared_state or client_state, in "
                             f"derived if it is recomputed, or in configuration if set-up fixes it (docs/PLUGINS.md)")
        for kind in ("shared_state", "client_state"):  # each value one a checkpoint can hold
            for state in declared(type(component), kind):
                try:
                    state_value(component, state)
                except InputError as e:
                    raise InputError(f"{key}: {name}: {e}") from None
        before = run.settings.setdefault(key, settings(component))
        changed = changed_settings(component, before)
        if changed:
            raise InputError(f"{key}: {name} changed {changed[0]!r} ({type(component).__name__}) after set-up, "
                             f"but declares it configuration, so a checkpoint would lose it: list it in shared_state "
                             f"or client_state, or in derived if it is recomputed (docs/PLUGINS.md)")


def check_memory(cfg: Config, world: World, m: int, d: int, task: Task | None = None,
                 path: str = "batched", trainer: LocalTrainer | None = None) -> int:
    """Refuse up front, with the estimate, an O(m d) algorithm state or a privacy mechanism's state
    (banded MF's noise history) that cannot fit (d: the trainable parameters, ``engine.params``),
    and (with ``task``) the model's frozen base (once per rank) and a local step (batch x model,
    ``guards.step_bytes``; with ``trainer`` also each client's trainable parameters, gradients and
    optimizer state, ``LocalTrainer.memory``) that cannot fit beside them. Returns the bytes held
    besides the local steps (state, noise, base)."""
    lo, hi = world.shard(m)
    need = int(ALGORITHMS.get(cfg.algorithm.name).obj.client_rows) * (hi - lo) * d * 4
    free, where = world.free_memory()  # a GPU shared by several ranks: its share
    if need > 0.9 * free:
        raise InputError(f"algorithm.name: {cfg.algorithm.name} keeps {need / 2**30:.1f} GiB of per-client state "
                         f"per rank ({hi - lo} clients x {d} parameters), more than the {free / 2**30:.1f} GiB "
                         f"{where} available; use more ranks or fewer clients")
    mechanism = MECHANISMS.get(cfg.privacy.mechanism).obj
    noise = mechanism.state_bytes(cfg.privacy, d)
    if need + noise > 0.9 * free:
        raise InputError(f"{mechanism.state_key}: {cfg.privacy.mechanism} keeps {noise / 2**30:.1f} GiB of noise "
                         f"state on every rank ({d} parameters), more than the {free / 2**30:.1f} GiB {where} "
                         f"available" + (f" besides {need / 2**30:.1f} GiB of per-client state" if need else ""))
    need += noise
    if task is None:
        return need
    base = frozen_bytes(task.model)  # the frozen base: once per rank, whatever the number of clients
    if need + base > 0.9 * free:
        raise InputError(f"task.model: the frozen base of {cfg.task.model} takes {base / 2**30:.1f} GiB on every "
                         f"rank, more than the {free / 2**30:.1f} GiB {where} available"
                         + (f" besides {need / 2**30:.1f} GiB of per-client state" if need else ""))
    need += base
    batch = int(task.sizes.max()) if cfg.train.full_gradient else cfg.train.batch_size
    mem = trainer.memory() if trainer is not None else None
    step = guards.step_bytes(task, batch, hi - lo, path, mem.parameters + mem.gradients + mem.optimizer if mem else 0)
    if need + step > 0.9 * free:
        key = "train.full_gradient" if cfg.train.full_gradient else "train.batch_size"
        raise InputError(f"{key}: a local step of {min(guards.STEP_CLIENTS, hi - lo)} clients x {batch} samples needs "
                         f"{step / 2**30:.1f} GiB, more than the {free / 2**30:.1f} GiB {where} available"
                         + (f" besides {need / 2**30:.1f} GiB of per-client state" if need else ""))
    return need


def memory_line(trainer: LocalTrainer, world: World, held: int) -> str:
    """The run log's line on memory (a model with a frozen base, or a language model): bytes per
    client by what they hold, the base once per rank, the clients of a block (``chunk_size``) and
    how many clients' local steps fit in this rank's memory beside ``held`` bytes (state, base)."""
    mem, base = trainer.memory(), frozen_bytes(trainer.task.model)
    free, where = world.free_memory()
    fit = max(0, int((0.9 * free - held) // max(mem.total, 1)))
    return (f"memory: {_size(mem.total)} per client ({trainer.spec.dim} trainable parameters {_size(mem.parameters)}, "
            f"gradient and update {_size(mem.gradients)}, optimizer state {_size(mem.optimizer)}, minibatch "
            f"{_size(mem.minibatch)}, activations {_size(mem.activations)}); frozen base {_size(base)} once per rank; "
            f"blocks of {trainer.chunk_size()} clients; {fit} clients fit at once in the {_size(free)} {where} "
            f"available")


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def check_step_inputs(cfg: Config, world: World, trainer: LocalTrainer) -> None:
    """Refuse up front, with the estimate, a round whose local steps cannot have their inputs drawn
    (``guards.step_inputs_bytes``): the key that sets the most steps is named."""
    lo, hi = world.shard(cfg.task.clients)
    clients = min(trainer.chunk_size(), max(hi - lo, 1))
    steps, tr = trainer.most_steps(), cfg.train
    batch = int(trainer.task.sizes.max()) if tr.full_gradient else tr.batch_size
    need = guards.step_inputs_bytes(steps, clients, batch, bool(tr.augment), tr.full_gradient)
    free, where = world.free_memory()
    if need > 0.5 * free:
        key = ("train.local_steps_file" if tr.local_steps_file is not None else
               "train.local_epochs" if tr.local_epochs is not None else "train.local_steps")
        raise InputError(f"{key}: {steps} local steps of a block of {clients} clients x {batch} samples need "
                         f"{need / 2**30:.1f} GiB of minibatch ids, more than half the {free / 2**30:.1f} GiB "
                         f"{where} available")


def build_task(cfg: Config, device: torch.device) -> Task:
    """Get, partition and place the data of ``cfg.task`` on ``device``; build the model."""
    data = dataset_arrays(cfg)
    if isinstance(data, Task):
        if getattr(cfg.task, "init", None) is not None:
            raise InputError(f"task.init: task.dataset {cfg.task.dataset} builds its own model, which starts "
                             f"from no pretrained one")
        return data.to(device)
    data = checked_arrays(data, cfg.task.dataset)
    xtr, ytr, xte, yte, classes = data.x_train, data.y_train, data.x_test, data.y_test, data.classes
    mean = std = None
    if data.image:
        mean = torch.tensor(data.mean, dtype=torch.float32, device=device)
        std = torch.tensor(data.std, dtype=torch.float32, device=device)
    m = cfg.task.clients
    if m > len(ytr):
        raise InputError(f"task.clients: {m} clients but only {len(ytr)} training samples")
    parts = _parts(data, m, cfg)
    parts, local = _local_test(data, parts, cfg, device)  # held out before anything counts the clients' samples
    order, offsets = _flat(parts)
    outputs = classes or ytr.shape[1]  # regression: one output per target
    loss = loss_fn(cfg.task.model) if classes else mse
    if isinstance(loss, TokenLoss) != (data.text is not None):
        raise InputError(f"task.model: {cfg.task.model} " + (
            f"reads token sequences, but task.dataset {cfg.task.dataset} is not a text dataset"
            if data.text is None else f"does not read token sequences, which task.dataset {cfg.task.dataset} gives "
                                      f"(a language model, e.g. transformer, does)"))
    init = getattr(cfg.task, "init", None)  # a pretrained model (models.pretrained)
    model = build_model(cfg.task.model, tuple(xtr.shape[1:]), outputs, seed=cfg.seed, params=cfg.task,
                        pretrained=None if init is None else functools.partial(
                            initialise, init=init, name=cfg.task.model, build=build_task))
    return Task(model=model.to(device), loss=loss,
                train_x=torch.from_numpy(np.ascontiguousarray(xtr)).to(device),
                train_y=torch.from_numpy(ytr).to(device),
                test_x=torch.from_numpy(np.ascontiguousarray(xte)).to(device),
                test_y=torch.from_numpy(yte).to(device),
                order=torch.from_numpy(order).to(device), offsets=offsets, classes=classes,
                label_hist=label_histogram(ytr, parts, classes) if classes and data.text is None else None,
                groups=client_groups(m, cfg.task.partition), mean=mean, std=std, image=data.image, text=data.text,
                **local)


def _parts(data: DataArrays, m: int, cfg: Config) -> list[np.ndarray]:
    """Each client's training sample indices (``task.partition``)."""
    kind = cfg.task.partition.kind
    if kind == "natural":
        if data.client_train is None:
            raise InputError(f"task.partition.kind: natural needs a dataset that gives client ids "
                             f"(DataArrays.client_train); {cfg.task.dataset!r} gives none")
        return natural_parts(data.client_train, m)
    if (not data.classes or data.text is not None) and kind != "iid":
        what = "a text dataset" if data.text is not None else "a regression dataset (classes 0)"
        raise InputError(f"task.partition.kind: {kind} splits by class labels; {what} takes iid or natural")
    labels = data.y_train if data.classes and data.text is None else np.zeros(len(data.y_train), np.int64)
    return partition(labels, m, cfg.task.partition, rng.generator(cfg.seed, "partition"))


def _local_test(data: DataArrays, parts: list[np.ndarray], cfg: Config,
                device: torch.device) -> tuple[list[np.ndarray], dict]:
    """The clients' training parts and the ``Task`` fields of their local test splits
    (``task.partition.local_test``: a fraction held out of ``parts``, or the dataset's own)."""
    p = cfg.task.partition
    if p.local_test == "dataset":
        if p.kind != "natural":
            raise InputError(f"task.partition.local_test: dataset (each client's own test samples) needs "
                             f"task.partition.kind: natural, got {p.kind}")
        if data.client_test is None:
            raise InputError(f"task.partition.local_test: dataset needs a dataset that gives each test sample's "
                             f"client (DataArrays.client_test); {cfg.task.dataset!r} gives none: hold out a "
                             f"fraction of the training samples instead (e.g. local_test: 0.2)")
        held, source = natural_test_parts(data.client_train, data.client_test, len(parts)), "test"
        empty = sum(h.size == 0 for h in held)
        if empty == len(held):
            raise InputError(f"task.partition.local_test: dataset, but no test sample of {cfg.task.dataset!r} "
                             f"belongs to one of the {len(held)} clients (its test users are not its training "
                             f"users?): hold out a fraction of the training samples instead (e.g. local_test: 0.2)")
        if empty:
            log.info("task.partition.local_test: %d of %d clients have no test samples (NaN in the per-client "
                     "values, left out of their summaries)", empty, len(held))
    elif p.local_test > 0:
        parts, held = split_local_test(parts, p.local_test, rng.generator(cfg.seed, "local_test"))
        source = "train"
    else:
        return parts, {}
    order, offsets = _flat(held)
    return parts, {"local_test_order": torch.from_numpy(order).to(device), "local_test_offsets": offsets,
                   "local_test_source": source}


def _flat(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per-client index arrays -> (order, offsets (m + 1,)): client i's are order[offsets[i]:offsets[i+1]]."""
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    return np.concatenate(parts).astype(np.int64), offsets


def client_info(cfg: Config) -> ClientInfo:
    """The clients' label histograms and groups for ``cfg`` without keeping the tensors."""
    return build_task(cfg, torch.device("cpu")).client_info(cfg.seed)
