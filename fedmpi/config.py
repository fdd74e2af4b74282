"""YAML -> typed, validated config objects; ``--set dotted.key=value`` overrides.

Every key, its type, default, allowed range and meaning is declared once, in a dataclass
(``opt(default, doc, ...)``): the sections below, and the parameters of each pluggable
component next to its code. Three blocks select components from the registries
(``fedmpi.registry``): ``algorithm`` (``name``), ``task`` (``dataset`` and ``model``) and
``availability`` (``kind``). Such a block is validated against the chosen components' own
dataclasses (e.g. ``algorithm: {name: fedswe, k: 100}`` against ``FedSWEParams``); a key that
belongs only to another registered component is ignored with a notice, any other unknown key
is an error. The README's config reference is generated from the built-in components
(``python -m fedmpi.config`` prints it). Any problem raises ``InputError`` whose message starts
with the dotted key path, e.g. ``train.lr: must be > 0, got -1``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import reprlib
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

import yaml

from . import plugins, registry, yamlio
from .errors import InputError
from .registry import Registry

log = logging.getLogger(__name__)


def opt(default: Any, doc: str, *, ge: float | None = None, gt: float | None = None,
        le: float | None = None, lt: float | None = None, selects: Registry | None = None) -> Any:
    """Declare a config key: default, one-line doc and numeric bounds; ``selects``: the key
    names a component of that registry (its block then takes the component's parameters)."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt, "selects": selects}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: _copy(d), metadata=meta)
    if dataclasses.is_dataclass(default):
        return field(default_factory=type(default), metadata=meta)
    return field(default=default, metadata=meta)


def _copy(x: Any) -> Any:
    return yaml.safe_load(yaml.safe_dump(x))


# ----------------------------------------------------------------------------- sections

@dataclass
class PartitionConfig:
    kind: Literal["iid", "dirichlet", "shards", "groups"] = opt(
        "iid", "how training samples are split over clients")
    alpha: float = opt(0.5, "Dirichlet concentration (dirichlet, groups)", gt=0)
    classes_per_client: int = opt(1, "classes per client (shards)", ge=1)
    groups: int = opt(2, "client groups that split the classes (groups)", ge=1)


@dataclass
class TaskConfig:
    """The ``task`` block's common keys; the chosen dataset's and model's own keys join them."""

    dataset: str = opt("fmnist", "dataset; fmnist falls back to synthetic (with a one-line notice) when absent",
                       selects=registry.DATASETS)
    root: Optional[str] = opt(None, "dataset folder; null = the standard location")
    cache_dir: Optional[str] = opt(None, "where converted datasets are cached; null = ~/.cache/fedmpi")
    clients: int = opt(100, "number of clients m (N)", ge=1)
    partition: PartitionConfig = opt(PartitionConfig(), "data partition over clients")
    model: str = opt("logreg", "model architecture (quadratic task: scalar)", selects=registry.MODELS)


@dataclass
class DatasetParams(TaskConfig):
    """Base of a dataset's own parameters (they sit in the ``task`` block)."""


@dataclass
class ModelParams(TaskConfig):
    """Base of a model's own parameters (they sit in the ``task`` block)."""


@dataclass
class TrainConfig:
    local_steps: int = opt(5, "s: local SGD steps per round", ge=1)
    batch_size: int = opt(32, "minibatch size (drawn uniformly with replacement)", ge=1)
    lr: float = opt(0.05, "eta_l (eta_0 when scheduled)", gt=0)
    lr_schedule: Literal["constant", "inv_sqrt"] = opt(
        "constant", "inv_sqrt: eta_0 / sqrt(t/10 + 1), t the 0-based round")
    global_lr: float = opt(1.0, "eta_g, server learning rate", gt=0)
    grad_clip: Optional[float] = opt(None, "clip each client's gradient to this norm; null = off", gt=0)
    momentum: float = opt(0.0, "local SGD momentum, buffer reset every round; 0 = plain SGD", ge=0, lt=1)
    weight_decay: float = opt(0.0, "local L2 weight decay, added to each (clipped) gradient; 0 = off", ge=0)
    augment: list = opt([], "on-device augmentation: any of crop, flip")
    augment_mode: Literal["per_image", "per_batch"] = opt(
        "per_image", "per_batch draws one crop/flip per minibatch (authors' code)")
    full_gradient: bool = opt(False, "local steps use the client's full local gradient (GD)")
    engine: Literal["auto", "batched", "sequential"] = opt(
        "auto", "batched = all clients of a rank at once; auto picks the faster path")


@dataclass
class AlgorithmParams:
    """The ``algorithm`` block: ``name``, then the chosen algorithm's own parameters (a subclass)."""

    name: str = opt("fedavg_active", "the algorithm", selects=registry.ALGORITHMS)


@dataclass
class BaseProbConfig:
    kind: Literal["fixed", "uniform", "beta", "dirichlet_phi"] = opt(
        "uniform", "how base probabilities p_i are made")
    values: Optional[list] = opt(None, "fixed: one p per client, or a single p for all")
    lo: float = opt(0.1, "uniform: lower end", ge=0, le=1)
    hi: float = opt(0.5, "uniform: upper end", ge=0, le=1)
    a: float = opt(0.5, "beta: a", gt=0)
    b: float = opt(0.5, "beta: b", gt=0)
    phi_max: Optional[list] = opt(None, "dirichlet_phi: Phi_c per class; null = 1 for the first half, 0.5 after")
    p_min: Optional[float] = opt(None, "floor applied to every p_i; null = none", ge=0, le=1)


@dataclass
class AvailabilityParams:
    """The ``availability`` block: ``kind``, then the chosen kind's own parameters (a subclass)."""

    kind: str = opt("always", "availability dynamics", selects=registry.AVAILABILITY)


@dataclass
class AvailabilityConfig(AvailabilityParams):
    """The keys shared by the built-in kinds (the default schema of a registered kind)."""

    base: BaseProbConfig = opt(BaseProbConfig(), "base probabilities p_i")
    period: int = opt(20, "P: period of staircase/sine/periodic_groups", ge=1)
    gamma: float = opt(0.3, "sine degree", ge=0, le=1)
    low: float = opt(0.4, "staircase: factor in the second half of each period", ge=0, le=1)
    cutoff: float = opt(0.1, "interleaved_sine: p below this is set to 0", ge=0, le=1)
    window: Literal["static", "staircase"] = opt("static", "periodic_groups: pattern inside a group's window")
    size: int = opt(10, "cohort: clients drawn uniformly per round", ge=1)
    groups: int = opt(2, "cyclic: number of groups K", ge=1)
    R: int = opt(0, "markov: minimum separation (rounds a client must wait)", ge=0)
    B: int = opt(1, "markov: clients per round (groups variant: the group size N/M, or 1)", ge=1)
    markov_groups: Optional[int] = opt(None, "markov: M groups of B clients run the chain; null = per client", ge=1)
    trace: Optional[str] = opt(None, "trace: file of available ids per round, 0/1 matrix, or on/off intervals")
    trace_format: Literal["auto", "ids", "matrix", "intervals"] = opt("auto", "trace: file format")
    schedule: Optional[Union[str, list]] = opt(
        None,
        "trace: the rounds inline, one list per round (available ids, or a 0/1 row of m); a string is a trace path")


@dataclass
class TopologyConfig:
    kind: Literal["rgg", "ring", "complete", "file"] = opt("rgg", "communication graph")
    radius: float = opt(0.4, "rgg: connection radius in the unit square", gt=0)
    max_attempts: int = opt(1000, "rgg: redraws allowed until connected", ge=1)
    file: Optional[str] = opt(None, "file: edge list, one 'i j' per line")


@dataclass
class ProbDistConfig:
    dist: Literal["beta", "uniform", "fixed"] = opt("beta", "distribution of the probabilities")
    a: float = opt(0.5, "beta: a", gt=0)
    b: float = opt(0.5, "beta: b", gt=0)
    lo: float = opt(0.0, "uniform: lower end (exclusive of 0)", ge=0, le=1)
    hi: float = opt(1.0, "uniform: upper end", gt=0, le=1)
    value: float = opt(1.0, "fixed: the probability", gt=0, le=1)


@dataclass
class SporadicityConfig:
    sgd_prob: ProbDistConfig = opt(ProbDistConfig(), "d_i: probability that client i takes an SGD step")
    link_prob: ProbDistConfig = opt(ProbDistConfig(), "b_ij: probability that edge ij is active")
    link_draw: Literal["per_edge", "per_endpoint"] = opt(
        "per_edge", "per_endpoint: link fires w.p. 1-(1-b)^2, the authors' draw (redrawn every iteration)")
    redraw_every: int = opt(0, "redraw d_i, b_ij every N iterations; 0 = never", ge=0)
    delay: Literal["raw", "normalized"] = opt(
        "raw", "emulated delay: raw (what the authors' stop budget sums) or normalized (their logged utilisation)")
    max_delay: Optional[float] = opt(None, "stop once the cumulative emulated delay reaches this", gt=0)


@dataclass
class EvaluationConfig:
    train: bool = opt(True, "also evaluate on the training set")
    train_samples: Optional[int] = opt(None, "evaluate train metrics on a fixed subsample of this size", ge=1)
    batch_size: int = opt(2000, "evaluation batch size", ge=1)


@dataclass
class RuntimeConfig:
    backend: Literal["auto", "nccl", "gloo"] = opt(
        "auto", "torch.distributed backend; auto = nccl when every rank has its own GPU, else gloo")
    device: Literal["auto", "cpu", "cuda"] = opt("auto", "auto = CUDA when available (rank r on GPU r mod GPUs)")
    threads: Optional[int] = opt(None, "torch CPU threads per rank; null = cores / local ranks", ge=1, le=1024)
    tf32: bool = opt(False, "let CUDA matmuls and convolutions round inputs to TF32 (faster on Ampere and later, "
                            "~1e-3 relative error); false = full float32, as on CPU")
    timeout_s: float = opt(300.0, "collective timeout: a dead rank ends the job after this", gt=0)
    checkpoint_every: int = opt(0, "rounds between checkpoints; 0 = off", ge=0)
    log_availability: bool = opt(False, "store the per-round participation mask")
    progress: bool = opt(True, "progress on rank 0's stderr: a tqdm bar on a TTY, else one line per evaluation")
    flush_s: float = opt(5.0, "write buffered result rows to the HDF5 file at most every N seconds "
                              "(and at checkpoints and the end)", ge=0)
    csv: bool = opt(False, "also write the metric rows to a CSV file next to the result file (RUN.csv)")
    tensorboard: Optional[str] = opt(None, "also log the metrics as TensorBoard scalars under this folder "
                                           "(needs the tensorboard package: fedmpi[tensorboard])")


@dataclass
class Config:
    name: str = opt("run", "experiment name, used in the default output path")
    seed: int = opt(0, "seed of every random stream", ge=0, le=2**64 - 1)
    rounds: int = opt(100, "global rounds (centralized) or iterations (decentralized)", ge=0)
    eval_every: int = opt(5, "evaluate every N rounds (and after the last)", ge=1)
    output: Optional[str] = opt(None, "result file, {dotted.key} placeholders allowed; "
                                      "null = runs/{name}-{algorithm.name}-s{seed}.h5")
    task: TaskConfig = opt(TaskConfig(), "data, partition and model")
    train: TrainConfig = opt(TrainConfig(), "local training")
    algorithm: AlgorithmParams = opt(AlgorithmParams(), "algorithm and its parameters")
    availability: AvailabilityParams = opt(AvailabilityParams(), "who is available when (centralized)")
    topology: TopologyConfig = opt(TopologyConfig(), "graph (decentralized)")
    sporadicity: SporadicityConfig = opt(SporadicityConfig(), "sporadic SGD and links (decentralized)")
    evaluation: EvaluationConfig = opt(EvaluationConfig(), "evaluation")
    runtime: RuntimeConfig = opt(RuntimeConfig(), "processes, devices, checkpoints")

    @property
    def output_path(self) -> str:
        """The result file: ``output`` (or its default) with ``{dotted.key}`` placeholders filled in."""
        from .results.paths import fill_placeholders

        if self.output is not None and not self.output.strip():
            raise InputError("output: empty result path (give a file name, or null for the default)")
        return fill_placeholders(self.output or DEFAULT_OUTPUT, self.to_dict(), "output")

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def resume_digest(self) -> str:
        """Hash of what a checkpoint depends on (not rounds, evaluation, output or runtime)."""
        d = self.to_dict()
        keep = {k: d[k] for k in ("seed", "task", "train", "algorithm", "availability", "topology", "sporadicity")}
        return hashlib.sha256(yaml.safe_dump(keep, sort_keys=True).encode()).hexdigest()[:16]

    def components(self) -> list[registry.Entry]:
        """The registry entries this config selects (dataset, model, algorithm, availability kind)."""
        out = []
        for f in dataclasses.fields(self):
            block = getattr(self, f.name)
            if dataclasses.is_dataclass(block):
                out += [reg.get(getattr(block, name)) for name, reg in _selectors(type(block)).items()]
        return out


DEFAULT_OUTPUT = "runs/{name}-{algorithm.name}-s{seed}.h5"


# ----------------------------------------------------------------------------- parsing

def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(str(a) for a in typing.get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join("null" if a is type(None) else _type_name(a) for a in typing.get_args(tp))
    if tp is list or origin is list:
        return "a list"
    return {int: "an integer", float: "a number", bool: "true/false", str: "a string"}.get(tp, str(tp))


def _coerce(value: Any, tp: Any, path: str) -> Any:
    origin = typing.get_origin(tp)
    if origin is Literal:
        if value in typing.get_args(tp):
            return value
        raise InputError(f"{path}: must be {_type_name(tp)}, got {_show(value)}")
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        for a in args:
            if a is type(None):
                continue
            try:
                return _coerce(value, a, path)
            except InputError:
                pass
        raise InputError(f"{path}: must be {_type_name(tp)}, got {_show(value)}")
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, path)
    if tp is bool:
        if isinstance(value, bool):
            return value
    elif tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer() and abs(value) < 2**62:
            return int(value)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise InputError(f"{path}: must be a finite number, got {_show(value)}")
            return float(value)
    elif tp is str:
        if isinstance(value, str):
            return value
    elif tp is list or typing.get_origin(tp) is list:
        if isinstance(value, list):
            return value
    raise InputError(f"{path}: must be {_type_name(tp)}, got {_show(value)}")


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxlong = 3, 6, 4, 60, 40


def _show(value: Any) -> str:
    """A bounded repr for messages (an expanded list or a huge number is not printed whole)."""
    return _REPR.repr(value)


def _check_bounds(value: Any, meta: dict, path: str, raw: Any = None) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    for k, ok, word in (("ge", lambda v, b: v >= b, ">="), ("gt", lambda v, b: v > b, ">"),
                        ("le", lambda v, b: v <= b, "<="), ("lt", lambda v, b: v < b, "<")):
        b = meta.get(k)
        if b is not None and not ok(value, b):
            raise InputError(f"{path}: must be {word} {b}, got {_show(value if raw is None else raw)}")
    if isinstance(value, int) and meta.get("le") is None and abs(value) >= 2**63:  # int64 in numpy and torch
        raise InputError(f"{path}: must be < 2^63, got {_show(value)}")


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else str(key)


def _build(cls: type, data: Any, path: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"{path or 'config'}: must be a mapping of keys, got {_show(data)}")
    if _selectors(cls):
        cls, data = _select(cls, data, path)
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for k in data:
        if k not in fields:
            raise InputError(f"{_join(path, k)}: unknown key (allowed: {', '.join(fields)})")
    kwargs = {}
    for name, f in fields.items():
        if name in data or _selectors(hints[name]):  # a selecting block's class depends on its keys
            p = _join(path, name)
            v = _coerce(data.get(name), hints[name], p)
            _check_bounds(v, f.metadata, p, raw=data.get(name))
            kwargs[name] = v
    return cls(**kwargs)


# ----------------------------------------------------------------------------- component blocks

def _selectors(cls: Any) -> dict[str, Registry]:
    """{key: registry} of the keys of dataclass ``cls`` that name a registered component."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return {}
    return {f.name: f.metadata["selects"] for f in dataclasses.fields(cls) if f.metadata.get("selects")}


def _select(base: type, data: dict, path: str) -> tuple[type, dict]:
    """The class of a selecting block (``base`` + the chosen components' parameters) and its keys.

    A key that only another registered component of the same registries declares is dropped with
    a notice (a config written for one algorithm keeps working with ``--set algorithm.name=...``);
    other unknown keys are left for ``_build`` to refuse."""
    chosen = []
    defaults = {f.name: f.default for f in dataclasses.fields(base)}
    for key, reg in _selectors(base).items():
        name = data.get(key, defaults[key])
        if not isinstance(name, str):
            raise InputError(f"{_join(path, key)}: must be the name of a registered {reg.kind} "
                             f"({', '.join(reg.names())}), got {name!r}")
        params = reg.get(name).params or base
        if not issubclass(params, base):
            raise InputError(f"{_join(path, key)}: {reg.kind} {name!r} declares parameters {params.__name__} "
                             f"that do not extend {base.__name__}")
        chosen.append(params)
    cls = _combine(base, chosen)
    known = {f.name for f in dataclasses.fields(cls)}
    owners: dict[str, list[str]] = {}
    for reg in _selectors(base).values():
        for e in reg.entries():
            for f in dataclasses.fields(e.params or base):
                owners.setdefault(f.name, []).append(e.name)
    kept = {}
    for k, v in data.items():
        if k in known or k not in owners:
            kept[k] = v
        else:
            what = " + ".join(str(data.get(key, defaults[key])) for key in _selectors(base))
            log.info("%s: not a parameter of %s (only of %s); ignored", _join(path, k), what, ", ".join(owners[k]))
    return cls, kept


_COMBINED: dict[tuple[type, ...], type] = {}


def _combine(base: type, chosen: list[type]) -> type:
    """One dataclass with the fields of every chosen parameter class (they all extend ``base``)."""
    parts = [c for c in dict.fromkeys(chosen) if not any(o is not c and issubclass(o, c) for o in chosen)]
    if len(parts) <= 1:
        return parts[0] if parts else base
    key = tuple(parts)
    if key not in _COMBINED:
        _COMBINED[key] = dataclasses.make_dataclass(
            f"{base.__name__}[{', '.join(c.__name__ for c in parts)}]", [], bases=key)
    return _COMBINED[key]


def _set_dotted(d: dict, dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    cur = d
    for i, k in enumerate(keys[:-1]):
        nxt = cur.get(k)
        if nxt is None:
            nxt = cur[k] = {}
        if not isinstance(nxt, dict):
            raise InputError(f"--set {dotted}: {'.'.join(keys[:i + 1])} is not a section")
        cur = nxt
    cur[keys[-1]] = value


def parse_override(item: str) -> tuple[str, Any]:
    """``"a.b=3"`` -> ``("a.b", 3)``; the value is parsed as a YAML scalar or list."""
    if "=" not in item:
        raise InputError(f"--set {item}: expected KEY=VALUE")
    k, v = item.split("=", 1)
    if not k.strip():
        raise InputError(f"--set {item}: empty key")
    return k.strip(), yamlio.loads(v, f"--set {k.strip()}") if v.strip() else None


def load(path: str | None = None, overrides: list[str] | None = None, world_size: int = 1,
         values: dict[str, Any] | None = None) -> Config:
    """Read a YAML file (or nothing), apply ``--set`` overrides (then ``values``: dotted key ->
    value, as a sweep cell's), validate everything."""
    plugins.load()  # the registries the config is checked against
    data: Any = {}
    if path is not None:
        data = yamlio.load_file(path, "config file")  # YAML 1.2 numbers, duplicate keys and bombs refused
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise InputError(f"{path}: top level must be a mapping of keys")
    for item in overrides or []:
        _set_dotted(data, *parse_override(item))
    for k, v in (values or {}).items():
        _set_dotted(data, k, _copy(v))
    cfg = _build(Config, data, "")
    validate(cfg, world_size)
    return cfg


def from_dict(data: dict, world_size: int = 1) -> Config:
    """Build and validate a config from a plain dict (tests, API users)."""
    plugins.load()
    cfg = _build(Config, _copy(data), "")
    validate(cfg, world_size)
    return cfg


def validate(cfg: Config, world_size: int = 1) -> None:
    """Checks that involve several keys (single-key checks happen while parsing); each selected
    component checks its own (``check`` of its registry entry)."""
    m = cfg.task.clients
    if world_size > m:
        raise InputError(f"task.clients: {m} clients cannot be sharded over {world_size} ranks (need >= ranks)")
    for a in cfg.train.augment:
        if a not in ("crop", "flip"):
            raise InputError(f"train.augment: unknown augmentation {a!r} (allowed: crop, flip)")
    for entry in cfg.components():
        if entry.check is not None:
            entry.check(cfg)


def check_availability(cfg: Config) -> None:
    """Cross-key checks of the built-in availability kinds (``AvailabilityConfig``)."""
    m, av = cfg.task.clients, cfg.availability
    b = av.base
    if b.lo > b.hi:
        raise InputError(f"availability.base.lo: must be <= hi ({b.hi}), got {b.lo}")
    if b.values is not None:
        if len(b.values) not in (1, m):
            raise InputError(f"availability.base.values: needs 1 or {m} (task.clients) values, got {len(b.values)}")
        for v in b.values:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise InputError(f"availability.base.values: probabilities must be in [0, 1], got {v!r}")
    elif b.kind == "fixed" and av.kind not in ("always", "cohort", "trace"):
        raise InputError("availability.base.values: base kind 'fixed' needs values")
    if av.schedule is not None and av.kind != "trace":
        raise InputError(f"availability.schedule: only used with availability.kind: trace (kind is {av.kind!r})")
    if av.schedule is not None and av.trace is not None:
        raise InputError("availability.schedule: give either schedule or trace, not both")
    if av.kind == "cohort" and av.size > m:
        raise InputError(f"availability.size: cohort of {av.size} exceeds task.clients ({m})")


def reference(cls: type = Config, prefix: str = "", who: str = "") -> list[str]:
    """The config reference as markdown table rows (key, default, allowed, meaning) of the
    built-in components; ``who`` prefixes the meanings (the components a key belongs to)."""
    plugins.load()
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key, hint = prefix + f.name, hints[f.name]
        if _selectors(hint):
            rows += _block_reference(hint, key + ".")
        elif dataclasses.is_dataclass(hint):
            rows += reference(hint, key + ".", who)
        else:
            rows.append(_reference_row(key, f, hint, who))
    return rows


def _reference_row(key: str, f: dataclasses.Field, hint: Any, who: str) -> str:
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    bounds = ", ".join(f"{w} {f.metadata[k]}" for k, w in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
                       if f.metadata.get(k) is not None)
    reg = f.metadata.get("selects")
    allowed = (f"one of {', '.join(reg.names(builtin_only=True))} (or a plug-in's)" if reg else _type_name(hint)) \
        + (f" ({bounds})" if bounds else "")
    shown = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
    return f"| `{key}` | `{shown}` | {allowed} | {who}{f.metadata.get('doc', '')} |"


def _block_reference(base: type, prefix: str) -> list[str]:
    """A selecting block: its common keys, then each built-in component's own keys once,
    marked with the components that take them (unmarked when every one does)."""
    rows = reference(base, prefix)
    seen = {f.name for f in dataclasses.fields(base)}
    for reg in _selectors(base).values():
        entries = reg.entries(builtin_only=True)
        for e in entries:
            cls = e.params or base
            hints = typing.get_type_hints(cls)
            for f in dataclasses.fields(cls):
                if f.name in seen:
                    continue
                seen.add(f.name)
                users = [x.name for x in entries if f.name in {g.name for g in dataclasses.fields(x.params or base)}]
                who = "" if len(users) == len(entries) else ", ".join(users) + ": "
                hint = hints[f.name]
                rows += (reference(hint, prefix + f.name + ".", who) if dataclasses.is_dataclass(hint)
                         else [_reference_row(prefix + f.name, f, hint, who)])
    return rows


if __name__ == "__main__":
    from fedmpi.config import reference as _reference  # the registries' classes, not this __main__ copy

    print("| key | default | allowed | meaning |\n|---|---|---|---|")
    print("\n".join(_reference()))
