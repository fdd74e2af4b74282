"""The root config, assembled from the sections their owners declare; YAML parsing and ``--set``.

Every key, its type, default, allowed range and meaning is declared once, with
``fedmpi.schema.opt``, in a dataclass next to the code that reads it: ``train`` in the local
step (``fedmpi.engine.local_step``), ``evaluation`` in the evaluator, ``topology`` and
``sporadicity`` in ``fedmpi.decentral`` (sections of the decentralized algorithms), the
parameters of each pluggable component next to its code; the ``runtime`` keys by the process
world (``fedmpi.runtime.world``), progress (``fedmpi.progress``), ``stop_at`` (``fedmpi.metrics``)
and, for the checkpointer and the result files, which sit above this module, ``fedmpi.outputs``.
This module owns the top-level keys and assembles the root ``Config``.

Three blocks select components from the registries (``fedmpi.registry``): ``algorithm``
(``name``), ``task`` (``dataset`` and ``model``) and ``availability`` (``kind``). Such a block is
validated against the chosen components' own dataclasses (e.g. ``algorithm: {name: fedswe, k:
100}`` against ``FedSWEParams``); a section used only by some components (``topology``) is read
when one of them is selected. One rule for every block and section: a key that belongs only to
another registered component is ignored with a notice naming its owners (a config written for
one algorithm keeps working with ``--set algorithm.name=...``), any other unknown key is an
error. The config reference (docs/CONFIG.md) is generated from the built-in components, grouped by
owner (``python -m fedmpi.docs``). Any problem raises ``InputError`` whose message starts with
the dotted key path, e.g. ``train.lr: must be > 0, got -1``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import reprlib
import sys
import types
import typing
from dataclasses import dataclass
from typing import Any, Literal, Optional, Union

import yaml

from . import plugins, registry, schema, yamlio
from .algorithms.base import AlgorithmParams, ServerParams  # noqa: F401  (public names)
from .clock.params import ClockParams
from .clock.params import check as check_clock
from .data.datasets import DatasetParams, PartitionConfig, TaskConfig  # noqa: F401  (public names)
from .decentral.sporadicity import ProbDistConfig, SporadicityConfig  # noqa: F401
from .decentral.topology import TopologyConfig
from .engine.local_step import TrainConfig
from .errors import InputError
from .log import muted
from .evaluator import EvaluationConfig
from .metrics import StopAtConfig, StopAtParams  # noqa: F401  (public names)
from .metrics import check as check_metrics
from .models import ModelParams  # noqa: F401
from .outputs import CheckpointParams, ResultFileParams, SidecarParams
from .participation.base import AvailabilityParams
from .participation.probs import BaseProbConfig  # noqa: F401
from .privacy.aggregation import AggregationParams, check as check_aggregation
from .privacy.params import PrivacyParams, check as check_privacy
from .progress import ProgressParams
from .registry import Registry
from .runtime.world import WorldParams
from .schema import copy as _copy
from .schema import opt

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- the root

@dataclass
class RuntimeConfig(StopAtParams, SidecarParams, ResultFileParams, ProgressParams, CheckpointParams, WorldParams):
    """The ``runtime`` block, assembled from its owners' keys (fields in reverse order of the
    bases): the process world's, the checkpointer's, progress, the result file's, its sidecars',
    ``stop_at``."""


@dataclass
class Config:
    # the resume rules of each section (``opt``'s ``result`` and ``resume``), which its keys inherit
    name: str = opt("run", "experiment name, used in the default output path", result=False, resume=True)
    seed: int = opt(0, "seed of every random stream", ge=0, le=2**64 - 1, result=True, resume=False)
    rounds: int = opt(100, "global rounds (centralized) or iterations (decentralized)", ge=0,
                      result=False, resume=True)  # a longer run's rows are a shorter one's and more
    eval_every: int = opt(5, "evaluate every N rounds (and after the last)", ge=1, result=False, resume=True)
    output: Optional[str] = opt(None, "result file, {dotted.key} placeholders allowed; "
                                      "null = runs/{name}-{algorithm.name}-s{seed}.h5 (the file records the "
                                      "path it was written to: --out's, placeholders filled)",
                                result=False, resume=True)
    task: TaskConfig = opt(TaskConfig(), "data, partition and model", result=True, resume=False)
    train: TrainConfig = opt(TrainConfig(), "local training", result=True, resume=False)
    algorithm: AlgorithmParams = opt(AlgorithmParams(), "algorithm and its parameters", result=True, resume=False)
    availability: AvailabilityParams = opt(AvailabilityParams(), "who is available when (centralized)",
                                           result=True, resume=False)
    topology: Optional[TopologyConfig] = opt(None, "graph (decentralized)", used_by=registry.ALGORITHMS,
                                             result=True, resume=False)
    sporadicity: Optional[SporadicityConfig] = opt(None, "sporadic SGD and links (decentralized)",
                                                   used_by=registry.ALGORITHMS, result=True, resume=False)
    evaluation: EvaluationConfig = opt(EvaluationConfig(), "evaluation", result=True, resume=True)
    runtime: RuntimeConfig = opt(RuntimeConfig(), "processes, devices, checkpoints", result=False, resume=True)
    privacy: PrivacyParams = opt(PrivacyParams(), "client-level differential privacy (centralized)",
                                 result=True, resume=False)
    clock: ClockParams = opt(ClockParams(), "virtual time: client durations, deadlines, over-selection",
                             result=True, resume=False)
    aggregation: AggregationParams = opt(AggregationParams(), "how the server sums: plain, or secure aggregation "
                                                              "emulated with its arithmetic (centralized)",
                                         result=True, resume=False)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def resume_digest(self) -> str:
        """Hash of what a checkpoint depends on: the keys declared not to change on a resume
        (``opt``'s ``resume``; not rounds, evaluation, output or runtime), and the keys a selected
        component reads from outside them (``reads_outside_digest``)."""
        return hashlib.sha256(yaml.safe_dump(self._digested(), sort_keys=True).encode()).hexdigest()[:16]

    def resume_differences(self, other: "Config") -> list[str]:
        """The dotted keys where ``other`` differs in what ``resume_digest`` covers."""
        return differing_keys(self.resume_keys(), other.resume_keys())

    def resume_keys(self) -> dict[str, str]:
        """What ``resume_digest`` covers, as {dotted key: repr of the value} (kept in checkpoints)."""
        return _renamed(_flat(self._digested()))

    def resume_refusals(self, record: dict[str, str]) -> list[str]:
        """The keys that keep this config from continuing a checkpoint whose ``resume_keys`` were
        ``record``: those whose values differ, those it records and this config lacks, and those it
        does not record (keys added since it was written) unless they are at their default, which
        does what that run did. Empty: it may continue, whatever the digests."""
        now, defaults, then = self.resume_keys(), _renamed(_flat(self._digested(defaults=True))), _renamed(record)
        return [k for k in dict.fromkeys([*then, *now])
                if (now.get(k, "-") != then[k] if k in then else now[k] != defaults.get(k, "-"))]

    def _digested(self, defaults: bool = False) -> dict:
        """The nested keys ``resume_digest`` hashes, with their values (``defaults``: their defaults)."""
        moved: list[tuple[str, Any]] = []
        keep = _digested(self, None, moved, defaults)
        for dotted, value in [*((d.at, d.default) for d in _relocated()), *moved]:  # Digest.at, declared
            section, _, key = dotted.partition(".")
            if isinstance(keep.get(section), dict):
                keep[section][key] = value
        if not defaults:  # (a read key has no default of its own here: a checkpoint must record it)
            keep.update(self.reads_outside_digest())  # e.g. rounds, when the noise is calibrated to them
        return keep

    def reads_changed(self, old: "Config", where: str = "the run being continued") -> str | None:
        """Why this config cannot continue (resume, or extend) a run of ``old`` when the two differ,
        of what ``resume_digest`` covers, only in keys a component reads from outside the digest's
        sections (``reads_outside_digest``; e.g. ``rounds`` under ``privacy.epsilon``): one line
        naming the key, both values and its readers. None when they differ nowhere, or elsewhere
        too (another experiment)."""
        differ = old.resume_differences(self)
        now, then = self.reads_outside_digest(), old.reads_outside_digest()
        if not differ or any(k not in now and k not in then for k in differ):
            return None
        key = differ[0]
        who = " and ".join(dict.fromkeys(f"{w} {r.why}" for w, r in [*self.reads(), *old.reads()] if r.key == key))
        return (f"{key}: {then.get(key)} in {where}, {now.get(key)} now, but {who}, so the rounds run so far "
                f"belong to the other value; keep {key}: {then.get(key)}, or start afresh with --overwrite")

    def changes_since(self, old: "Config") -> dict[str, list[str]]:
        """{dotted key: [old value, new value]} of every key that differs from ``old`` (as shown by
        ``repr``), for the record of a resumed run."""
        a, b = _flat(old.to_dict()), _flat(self.to_dict())
        return {k: [a.get(k, "-"), b.get(k, "-")] for k in dict.fromkeys([*a, *b]) if a.get(k, "-") != b.get(k, "-")}

    def components(self) -> list[registry.Entry]:
        """The registry entries this config selects (dataset, model, algorithm, availability kind,
        privacy mechanism)."""
        return [entry for _, entry in self._selected()]

    def _selected(self) -> list[tuple[Registry, registry.Entry]]:
        out = []
        for f in dataclasses.fields(self):
            block = getattr(self, f.name)
            if dataclasses.is_dataclass(block):
                out += [(reg, reg.get(getattr(block, name))) for name, reg in _selectors(type(block)).items()]
        return out

    def reads(self) -> list[tuple[str, schema.Reads]]:
        """The keys of other sections that the selected components declare they read and read with
        this config ((who, ``Reads``), who as ``algorithm.name scaffold``)."""
        return [(f"{reg.key} {entry.name}", r) for reg, entry in self._selected()
                for r in entry.options.get("reads", ()) if r.applies(self)]

    def reads_outside_digest(self) -> dict[str, Any]:
        """{dotted key: value} of the keys a selected component reads that ``resume_digest`` would
        not otherwise cover (under ``privacy.epsilon``: ``rounds``, which the noise is calibrated
        to). They join the digest, so that a resume, or a completed run extended, with another value
        is refused naming the key: ask this before letting such a key change."""
        return {r.key: r.value(self) for _, r in self.reads() if _may_change(self, r.key)}


def _digested(block: Any, may_change: bool | None, moved: list[tuple[str, Any]], defaults: bool) -> dict | None:
    """The keys of the dataclass instance ``block`` that may not change on a resume (``opt``'s
    ``resume``; ``may_change``: its block's), as nested plain data: their values, or with
    ``defaults`` their declared defaults; None when the block is off (``Digest.off``). A key hashed
    at another place (``Digest.at``) goes to ``moved`` as (dotted key, value)."""
    out: dict = {}
    for f in dataclasses.fields(block):
        free = _inherit(f, "resume", may_change)
        value, how = getattr(block, f.name), f.metadata.get("digest") or schema.NO_DIGEST
        if how.off is not schema.ABSENT and value == how.off:
            return None
        if free or how.leaves_out(value, block):
            continue
        if dataclasses.is_dataclass(value):
            inner = _digested(value, free, moved, defaults)
            if inner is not None:
                out[f.name] = inner
            continue
        plain = _plain(_default(f) if defaults else value)
        if how.at is not None:
            moved.append((how.at, plain))
        else:
            out[f.name] = plain
    return out


def _inherit(f: dataclasses.Field, what: str, outer: bool | None) -> bool:
    """A key's declared ``result`` or ``resume`` (``opt``), else its block's."""
    own = f.metadata.get(what)
    return bool(outer) if own is None else own


def _default(f: dataclasses.Field) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()


def _plain(value: Any) -> Any:
    """A value as ``dataclasses.asdict`` gives it (nested dataclasses as dicts, containers copied)."""
    return dataclasses.asdict(_Box(value))["value"]


@dataclass
class _Box:
    value: Any


def _relocated() -> list[schema.Digest]:
    """The ``Digest.at`` declarations of every registered component's keys: each is hashed at its old
    place with its default where the selected component does not declare it (a key once every
    component's, or one that moved)."""
    found = []
    for reg in (registry.ALGORITHMS, registry.AVAILABILITY, registry.MECHANISMS, registry.ADAPTERS):
        for entry in reg:
            for f in dataclasses.fields(entry.params) if entry.params is not None else ():
                how = f.metadata.get("digest")
                if how is not None and how.at is not None and how not in found:
                    found.append(how)
    return found


def _may_change(cfg: Any, dotted: str) -> bool:
    """Whether the key ``dotted`` of ``cfg`` is declared to change on a resume (``opt``'s ``resume``,
    inherited from its blocks); a key the config does not have counts as one that may."""
    block, free = cfg, None
    for part in dotted.split("."):
        if not dataclasses.is_dataclass(block):
            return True
        f = next((f for f in dataclasses.fields(block) if f.name == part), None)
        if f is None:
            return True
        free, block = _inherit(f, "resume", free), getattr(block, part)
    return bool(free)


def run_keys(cls: type = None, prefix: str = "", outer: bool = True) -> list[str]:
    """The keys declared not to change a number a run stores (``opt``'s ``result``: False), each at
    the outermost block that declares it (``runtime`` covers its keys); the built-in components'."""
    cls = Config if cls is None else cls
    plugins.load()
    out: list[str] = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        result = _inherit(f, "result", outer)
        if not result and outer:
            out.append(prefix + f.name)
            continue
        hint = hints[f.name]
        if f.metadata.get("used_by"):
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        kinds = [hint] + ([e.params for reg in _selectors(hint).values() for e in reg.entries(builtin_only=True)
                           if e.params is not None] if dataclasses.is_dataclass(hint) else [])
        for kind in kinds if dataclasses.is_dataclass(hint) else ():
            out += [k for k in run_keys(kind, f"{prefix}{f.name}.", result) if k not in out]
    return out


def differing_keys(a: dict[str, str], b: dict[str, str]) -> list[str]:
    """The keys of two ``resume_keys`` mappings whose values differ (or that one lacks); a moved
    key (``MOVED``, in an old checkpoint's mapping) counts as its new spelling."""
    a, b = _renamed(a), _renamed(b)
    return [k for k in dict.fromkeys([*a, *b]) if a.get(k, "-") != b.get(k, "-")]


def _renamed(keys: dict[str, str]) -> dict[str, str]:
    return {MOVED.get(k, k): v for k, v in keys.items()}


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    """A nested mapping as {dotted key: repr of the value}."""
    if not isinstance(d, dict) or not d:
        return {prefix.rstrip("."): repr(d)}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}{k}."))
    return out


# ----------------------------------------------------------------------------- moved keys

#: Keys that moved to the component that reads them (``schema.MOVED``, old dotted spelling -> new
#: one). The old one is still read (configs, --set, sweep cells, result files and checkpoints made
#: before), as the new one with one notice; both given with different values is an error.
MOVED = schema.MOVED


def _new_spelling(dotted: str) -> str:
    """``dotted``, or its new spelling (with the notice) when it moved."""
    if dotted in MOVED:
        log.info("%s: the server's learning rate is now %s (read as that key)", dotted, MOVED[dotted])
    return MOVED.get(dotted, dotted)


def _move(data: dict) -> None:
    """Move each old spelling of ``MOVED`` in nested ``data`` to its new place (in place), with
    its notice; the old and the new key both given with different values is an error."""
    def check(old: str, new: str, value: Any, there: Any) -> None:
        if there is not schema.ABSENT and there != value:
            raise InputError(f"{old}: {_show(value)} and {new}: {_show(there)} are both given ({old} is "
                             f"the old name of {new}: give only {new})")
        _new_spelling(old)

    schema.move_keys(data, check)


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
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        p = _join(path, name)
        if f.metadata.get("used_by"):  # follows the blocks before it: the selecting one is built
            kwargs[name] = _section(f, hints[name], data.get(name), p, kwargs)
        elif name in data or _selectors(hints[name]):  # a selecting block's class depends on its keys
            v = _coerce(data.get(name), hints[name], p)
            _check_bounds(v, f.metadata, p, raw=data.get(name))
            kwargs[name] = v
    return cls(**kwargs)


def _section(f: dataclasses.Field, hint: Any, value: Any, path: str, built: dict[str, Any]) -> Any:
    """A section used only by the components of ``f.metadata["used_by"]`` that list it in their
    ``sections``: built when the selected one does, else ``None`` (a given value dropped with a
    notice naming its users, as a foreign key of a block)."""
    reg = f.metadata["used_by"]
    chosen = next(getattr(block, key) for block in built.values() for key, r in _selectors(type(block)).items()
                  if r is reg)
    users = [e.name for e in reg.entries() if path.rsplit(".", 1)[-1] in e.options.get("sections", ())]
    if chosen in users:
        cls = next(a for a in typing.get_args(hint) if a is not type(None))
        return _build(cls, value, path)
    if value is not None:
        if not users:
            raise InputError(f"{path}: no registered {reg.kind} uses this section")
        log.info("%s: not used by %s %s (only by %s); ignored", path, reg.kind, chosen, ", ".join(users))
    return None


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
    _move(data)
    given: dict[str, tuple[str, Any]] = {}  # new spelling -> (spelling, value) of the command line
    pairs = [pair for item in overrides or [] for pair in schema.dotted(*parse_override(item))]
    pairs += [(k, _copy(v)) for k, v in (values or {}).items()]
    for key, value in pairs:
        new = _new_spelling(key)
        said, there = given.get(new, (key, value))
        if said != key and there != value:  # the pair ``_move`` refuses in a YAML file, on the command line
            old = key if key in MOVED else said
            raise InputError(f"{said}: {_show(there)} and {key}: {_show(value)} are both given ({old} is the "
                             f"old name of {new}: give only {new})")
        given[new] = (key, value)
        _set_dotted(data, new, value)
    cfg = _build(Config, data, "")
    validate(cfg, world_size)
    return cfg


def from_stored(config_yaml: str) -> Config | None:
    """The config a result file stores (``config`` attribute), or None when it is no longer a valid
    config. The text comes from a file: it is read with the input limits (yamlio), silently."""
    try:
        with muted():
            return from_dict(yamlio.loads(config_yaml, "config") or {})
    except (InputError, TypeError, ValueError, AttributeError):
        return None


def from_dict(data: dict, world_size: int = 1) -> Config:
    """Build and validate a config from a plain dict (tests, API users)."""
    plugins.load()
    data = _copy(data)
    if isinstance(data, dict):
        _move(data)
    cfg = _build(Config, data, "")
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
    for who, r in cfg.reads():  # what a component reads of another section, and supports
        value = r.value(cfg)
        if r.supports is not None and not r.supports(value):
            raise InputError(f"{r.key}: {who} {r.why}; it needs {r.expect}, got {_show(value)}")
    check_privacy(cfg)
    check_clock(cfg)
    check_aggregation(cfg)
    check_metrics(cfg)


def reference(cls: type = Config, prefix: str = "", who: str = "") -> list[tuple[str, str]]:
    """The config reference of the built-in components: (owner, markdown table row) pairs, the
    owner being the file that declares the key; ``who`` prefixes the meanings (the components a
    key belongs to)."""
    plugins.load()
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key, hint = prefix + f.name, hints[f.name]
        if f.metadata.get("used_by"):
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        if _selectors(hint):
            rows += _block_reference(hint, key + ".")
        elif dataclasses.is_dataclass(hint):
            rows += reference(hint, key + ".", who)
        else:
            rows.append((_declared_in(cls, f.name), _reference_row(key, f, hint, who)))
    return rows


def _declared_in(cls: type, name: str) -> str:
    """The file of the class in ``cls``'s bases that declares field ``name``."""
    owner = next(c for c in cls.__mro__ if name in vars(c).get("__annotations__", {}))
    path = sys.modules[owner.__module__].__file__ or ""
    return os.path.relpath(path, os.path.dirname(os.path.dirname(__file__))).replace(os.sep, "/")


def _reference_row(key: str, f: dataclasses.Field, hint: Any, who: str) -> str:
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    bounds = ", ".join(f"{w} {f.metadata[k]}" for k, w in (("ge", ">="), ("gt", ">"), ("le", "<="), ("lt", "<"))
                       if f.metadata.get(k) is not None)
    reg = f.metadata.get("selects")
    allowed = (f"one of {', '.join(reg.names(builtin_only=True))} (or a plug-in's)" if reg else _type_name(hint)) \
        + (f" ({bounds})" if bounds else "")
    shown = yaml.safe_dump(default, default_flow_style=True).strip().removesuffix("...").strip()
    return f"| `{key}` | `{shown}` | {allowed} | {who}{f.metadata.get('doc', '')} |"


def _block_reference(base: type, prefix: str) -> list[tuple[str, str]]:
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
                rows += (_block_reference(hint, prefix + f.name + ".") if _selectors(hint) else
                         reference(hint, prefix + f.name + ".", who) if dataclasses.is_dataclass(hint)
                         else [(_declared_in(cls, f.name), _reference_row(prefix + f.name, f, hint, who))])
    return rows
