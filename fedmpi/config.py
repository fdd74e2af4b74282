"""YAML -> typed, validated config objects; ``--set dotted.key=value`` overrides.

Every key, its type, default, allowed range and meaning is declared once, here, in the
dataclasses below (``opt(default, doc, ...)``); the README's config reference is generated
from them (``python -m fedmpi.config`` prints it). Any problem raises ``InputError`` whose
message starts with the dotted key path, e.g. ``train.lr: must be > 0, got -1``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import reprlib
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Literal, Optional, Union

import yaml

from . import yamlio
from .errors import InputError


def opt(default: Any, doc: str, *, ge: float | None = None, gt: float | None = None,
        le: float | None = None, lt: float | None = None) -> Any:
    """Declare a config key: default, one-line doc and numeric bounds."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: _copy(d), metadata=meta)
    if dataclasses.is_dataclass(default):
        return field(default_factory=type(default), metadata=meta)
    return field(default=default, metadata=meta)


def _copy(x: Any) -> Any:
    return yaml.safe_load(yaml.safe_dump(x))


# ----------------------------------------------------------------------------- sections

@dataclass
class SyntheticConfig:
    samples: int = opt(12000, "training samples of the synthetic Gaussian-mixture set", ge=1)
    test_samples: int = opt(2000, "test samples of the synthetic set", ge=1)
    features: int = opt(32, "input features (flat vectors)", ge=1)
    classes: int = opt(10, "number of classes (one Gaussian per class)", ge=2)
    separation: float = opt(1.0, "distance scale between class means (larger = easier)", gt=0, le=1e6)


@dataclass
class PartitionConfig:
    kind: Literal["iid", "dirichlet", "shards", "groups"] = opt(
        "iid", "how training samples are split over clients")
    alpha: float = opt(0.5, "Dirichlet concentration (dirichlet, groups)", gt=0)
    classes_per_client: int = opt(1, "classes per client (shards)", ge=1)
    groups: int = opt(2, "client groups that split the classes (groups)", ge=1)


@dataclass
class TaskConfig:
    dataset: Literal["fmnist", "mnist", "cifar10", "svhn", "cinic10", "synthetic", "quadratic"] = opt(
        "fmnist", "dataset; fmnist falls back to synthetic (with a one-line notice) when absent")
    root: Optional[str] = opt(None, "dataset folder; null = the standard location")
    cache_dir: Optional[str] = opt(None, "where converted datasets are cached; null = ~/.cache/fedmpi")
    clients: int = opt(100, "number of clients m (N)", ge=1)
    partition: PartitionConfig = opt(PartitionConfig(), "data partition over clients")
    model: Literal["logreg", "linear_svm", "mlp", "svhn_cnn", "cifar_cnn", "cinic_cnn", "vgg11", "scalar"] = opt(
        "logreg", "model architecture (quadratic task: scalar)")
    hidden: int = opt(200, "hidden width of mlp", ge=1)
    u: Optional[list] = opt(None, "quadratic only: client optima u_i (numbers, or equal-length lists)")
    x0: float = opt(0.0, "quadratic only: initial model value")
    synthetic: SyntheticConfig = opt(SyntheticConfig(), "shape of the synthetic dataset")
    fallback_synthetic: bool = opt(True, "fmnist at the standard location missing -> synthetic (else exit 2)")


@dataclass
class TrainConfig:
    local_steps: int = opt(5, "s: local SGD steps per round", ge=1)
    batch_size: int = opt(32, "minibatch size (drawn uniformly with replacement)", ge=1)
    lr: float = opt(0.05, "eta_l (eta_0 when scheduled)", gt=0)
    lr_schedule: Literal["constant", "inv_sqrt"] = opt(
        "constant", "inv_sqrt: eta_0 / sqrt(t/10 + 1), t the 0-based round")
    global_lr: float = opt(1.0, "eta_g, server learning rate", gt=0)
    grad_clip: Optional[float] = opt(None, "clip each client's gradient to this norm; null = off", gt=0)
    augment: list = opt([], "on-device augmentation: any of crop, flip")
    augment_mode: Literal["per_image", "per_batch"] = opt(
        "per_image", "per_batch draws one crop/flip per minibatch (authors' code)")
    full_gradient: bool = opt(False, "local steps use the client's full local gradient (GD)")
    engine: Literal["auto", "batched", "sequential"] = opt(
        "auto", "batched = all clients of a rank at once; auto picks the faster path")


@dataclass
class AlgorithmConfig:
    name: Literal[
        "fedavg_active", "fedavg_all", "fedknown", "gfedavg", "fedau", "f3ast", "mifa", "fedvarp",
        "fedswe", "fedavg_markov", "debiased_fedavg",
        "dspodfl", "dgd", "rg", "sporadic_sgd", "dfedavg"] = opt("fedavg_active", "the algorithm")
    k: Optional[float] = opt(None, "fedswe: moving-average coefficient k (0 = FedAWE); null = m", ge=0)
    server_clip: Optional[float] = opt(None, "fedswe: rescale the mean echoed change to this norm", gt=0)
    amplification: float = opt(10.0, "gfedavg: amplification a", gt=0)
    anchor_period: int = opt(100, "gfedavg: rounds P between amplifications", ge=1)
    fedau_cap: int = opt(50, "fedau: interval cap K", ge=1)
    select: int = opt(10, "f3ast: clients selected per round among the available", ge=1)
    rate_beta: float = opt(0.001, "f3ast: rate-estimate smoothing beta", gt=0, le=1)
    warmup: int = opt(0, "debiased_fedavg: rounds with nu_i = 1", ge=0)
    nu_max: Optional[float] = opt(None, "debiased_fedavg: cap on nu_i; null = none", gt=0)


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
class AvailabilityConfig:
    kind: Literal["always", "cohort", "stationary", "staircase", "sine", "interleaved_sine",
                  "periodic_groups", "cyclic", "markov", "trace"] = opt("always", "availability dynamics")
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
        None, "trace: the rounds inline, one list per round (available ids, or a 0/1 row of m); a string is a trace path")


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
        "per_edge", "per_endpoint: link fires w.p. 1-(1-b)^2 (authors' code)")
    redraw_every: int = opt(0, "redraw d_i, b_ij every N iterations; 0 = never", ge=0)
    delay: Literal["raw", "normalized"] = opt("raw", "emulated delay formula")
    max_delay: Optional[float] = opt(None, "stop once the cumulative emulated delay reaches this", gt=0)


@dataclass
class EvaluationConfig:
    train: bool = opt(True, "also evaluate on the training set")
    train_samples: Optional[int] = opt(None, "evaluate train metrics on a fixed subsample of this size", ge=1)
    batch_size: int = opt(2000, "evaluation batch size", ge=1)


@dataclass
class RuntimeConfig:
    backend: Literal["auto", "nccl", "gloo"] = opt("auto", "torch.distributed backend; auto = nccl with CUDA")
    device: Literal["auto", "cpu", "cuda"] = opt("auto", "auto = cuda:local_rank when available")
    threads: Optional[int] = opt(None, "torch CPU threads per rank; null = cores / local ranks", ge=1, le=1024)
    timeout_s: float = opt(300.0, "collective timeout: a dead rank ends the job after this", gt=0)
    checkpoint_every: int = opt(0, "rounds between checkpoints; 0 = off", ge=0)
    log_availability: bool = opt(False, "store the per-round participation mask")
    progress: bool = opt(True, "tqdm progress bar on rank 0 (only on a TTY)")


@dataclass
class Config:
    name: str = opt("run", "experiment name, used in the default output path")
    seed: int = opt(0, "seed of every random stream", ge=0, le=2**64 - 1)
    rounds: int = opt(100, "global rounds (centralized) or iterations (decentralized)", ge=0)
    eval_every: int = opt(5, "evaluate every N rounds (and after the last)", ge=1)
    output: Optional[str] = opt(None, "result file; null = runs/{name}-s{seed}.h5")
    task: TaskConfig = opt(TaskConfig(), "data, partition and model")
    train: TrainConfig = opt(TrainConfig(), "local training")
    algorithm: AlgorithmConfig = opt(AlgorithmConfig(), "algorithm and its parameters")
    availability: AvailabilityConfig = opt(AvailabilityConfig(), "who is available when (centralized)")
    topology: TopologyConfig = opt(TopologyConfig(), "graph (decentralized)")
    sporadicity: SporadicityConfig = opt(SporadicityConfig(), "sporadic SGD and links (decentralized)")
    evaluation: EvaluationConfig = opt(EvaluationConfig(), "evaluation")
    runtime: RuntimeConfig = opt(RuntimeConfig(), "processes, devices, checkpoints")

    @property
    def output_path(self) -> str:
        return self.output or f"runs/{self.name}-s{self.seed}.h5"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def resume_digest(self) -> str:
        """Hash of what a checkpoint depends on (not rounds, evaluation, output or runtime)."""
        d = self.to_dict()
        keep = {k: d[k] for k in ("seed", "task", "train", "algorithm", "availability", "topology", "sporadicity")}
        return hashlib.sha256(yaml.safe_dump(keep, sort_keys=True).encode()).hexdigest()[:16]



DECENTRALIZED = ("dspodfl", "dgd", "rg", "sporadic_sgd", "dfedavg")


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


def _build(cls: type, data: Any, path: str) -> Any:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InputError(f"{path or 'config'}: must be a mapping of keys, got {_show(data)}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    for k in data:
        if k not in fields:
            where = f"{path}.{k}" if path else str(k)
            raise InputError(f"{where}: unknown key (allowed: {', '.join(fields)})")
    kwargs = {}
    for name, f in fields.items():
        if name in data:
            p = f"{path}.{name}" if path else name
            v = _coerce(data[name], hints[name], p)
            _check_bounds(v, f.metadata, p, raw=data[name])
            kwargs[name] = v
    return cls(**kwargs)


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


def load(path: str | None = None, overrides: list[str] | None = None, world_size: int = 1) -> Config:
    """Read a YAML file (or nothing), apply ``--set`` overrides, validate everything."""
    data: Any = {}
    if path is not None:
        data = yamlio.load_file(path, "config file")  # YAML 1.2 numbers, duplicate keys and bombs refused
        if data is None:
            data = {}
        if not isinstance(data, dict):
            raise InputError(f"{path}: top level must be a mapping of keys")
    for item in overrides or []:
        _set_dotted(data, *parse_override(item))
    cfg = _build(Config, data, "")
    validate(cfg, world_size)
    return cfg


def from_dict(data: dict, world_size: int = 1) -> Config:
    """Build and validate a config from a plain dict (tests, API users)."""
    cfg = _build(Config, _copy(data), "")
    validate(cfg, world_size)
    return cfg


def validate(cfg: Config, world_size: int = 1) -> None:
    """Checks that involve several keys (single-key checks happen while parsing)."""
    m = cfg.task.clients
    if world_size > m:
        raise InputError(f"task.clients: {m} clients cannot be sharded over {world_size} ranks (need >= ranks)")
    t = cfg.task
    if t.dataset == "quadratic":
        if t.model != "scalar":
            raise InputError(f"task.model: the quadratic task needs model 'scalar', got {t.model!r}")
        if t.u is None:
            raise InputError("task.u: the quadratic task needs the client optima u (one per client)")
    elif t.model == "scalar":
        raise InputError(f"task.model: 'scalar' is only for dataset quadratic, got dataset {t.dataset!r}")
    if t.u is not None:
        if len(t.u) != m:
            raise InputError(f"task.u: needs one entry per client ({m}), got {len(t.u)}")
        dims = {len(x) if isinstance(x, list) else 0 for x in t.u}
        if len(dims) != 1 or not all(_is_num_or_numlist(x) for x in t.u):
            raise InputError("task.u: entries must all be numbers or all be lists of numbers of one length")
    for a in cfg.train.augment:
        if a not in ("crop", "flip"):
            raise InputError(f"train.augment: unknown augmentation {a!r} (allowed: crop, flip)")
    b = cfg.availability.base
    if b.lo > b.hi:
        raise InputError(f"availability.base.lo: must be <= hi ({b.hi}), got {b.lo}")
    if b.values is not None:
        if len(b.values) not in (1, m):
            raise InputError(f"availability.base.values: needs 1 or {m} (task.clients) values, got {len(b.values)}")
        for v in b.values:
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
                raise InputError(f"availability.base.values: probabilities must be in [0, 1], got {v!r}")
    elif b.kind == "fixed" and cfg.availability.kind not in ("always", "cohort", "trace"):
        raise InputError("availability.base.values: base kind 'fixed' needs values")
    av = cfg.availability
    if av.schedule is not None and av.kind != "trace":
        raise InputError(f"availability.schedule: only used with availability.kind: trace (kind is {av.kind!r})")
    if av.schedule is not None and av.trace is not None:
        raise InputError("availability.schedule: give either schedule or trace, not both")
    if av.kind == "cohort" and av.size > m:
        raise InputError(f"availability.size: cohort of {av.size} exceeds task.clients ({m})")
    if cfg.algorithm.name in DECENTRALIZED and av.kind != "always":
        raise InputError(f"availability.kind: decentralized algorithm {cfg.algorithm.name!r} uses sporadicity, "
                         f"not availability (leave availability.kind: always)")


def _is_num_or_numlist(x: Any) -> bool:
    num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)  # noqa: E731
    return num(x) or (isinstance(x, list) and len(x) > 0 and all(num(v) for v in x))


def reference(cls: type = Config, prefix: str = "") -> list[str]:
    """The config reference as markdown table rows (key, default, meaning)."""
    rows = []
    for f in dataclasses.fields(cls):
        key = prefix + f.name
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        hint = typing.get_type_hints(cls)[f.name]
        if dataclasses.is_dataclass(hint):
            rows += reference(hint, key + ".")
            continue
        bounds = ", ".join(f"{w} {f.metadata[k]}" for k, w in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
                           if f.metadata.get(k) is not None)
        allowed = _type_name(hint) + (f" ({bounds})" if bounds else "")
        rows.append(f"| `{key}` | `{yaml.safe_dump(default, default_flow_style=True).strip().removesuffix('...').strip()}` "
                    f"| {allowed} | {f.metadata['doc']} |")
    return rows


if __name__ == "__main__":
    print("| key | default | allowed | meaning |\n|---|---|---|---|")
    print("\n".join(reference()))
