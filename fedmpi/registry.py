"""One registry mechanism for everything a user can plug in.

A ``Registry`` maps a name to the object that builds a component (an algorithm class, a model
or dataset factory, an availability factory, a callback, a metric) and to the dataclass of that
component's own parameters. The config (``fedmpi.config``) checks names and parameters against
the registries AFTER plug-ins are loaded (``fedmpi.plugins``), so a user's component is named,
configured and validated exactly like a built-in one.

The packages register into the registries below (``fedmpi.algorithms.register``,
``fedmpi.models.register``, ``fedmpi.data.datasets.register_dataset``,
``fedmpi.participation.register``, ``fedmpi.privacy.mechanism.register``,
``fedmpi.models.adapters.register_adapter``). An entry's
``options["reads"]`` are the keys of other sections the component reads (``schema.Reads``), which
``fedmpi.config`` checks. This module imports nothing that registers: filling the
registries is the loader's job (``fedmpi.plugins.load``: the built-ins, then the plug-ins).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from .errors import InputError


@dataclass(frozen=True)
class Entry:
    """One registered component."""

    name: str
    obj: Any  # what builds it (class or factory)
    params: type | None  # dataclass of its own parameters; None = only the block's common keys
    check: Callable[[Any], None] | None  # cross-key check of the whole config (raises InputError)
    options: dict = field(default_factory=dict)  # registry-specific extras (e.g. a model's loss)
    module: str = ""  # where it was registered

    @property
    def builtin(self) -> bool:
        return is_builtin(self.module)


def is_builtin(module: str) -> bool:
    """Whether ``module`` (where something was registered) is fedmpi's own."""
    return module == "fedmpi" or module.startswith("fedmpi.")


PLUGIN_HINT = ("a plug-in's name is known once the plug-in is loaded: --plugin PATH_OR_MODULE, "
               "$FEDMPI_PLUGINS or a sweep file's plugins:")


class Registry:
    """Name -> ``Entry`` for one kind of component; ``key`` is the config key that selects it."""

    def __init__(self, kind: str, key: str):
        self.kind, self.key = kind, key
        self._entries: dict[str, Entry] = {}

    def register(self, name: str, obj: Any = None, *, params: type | None = None,
                 check: Callable[[Any], None] | None = None, **options: Any) -> Any:
        """Register ``obj`` as ``name``; without ``obj``, a decorator that registers what it decorates."""

        def add(target: Any) -> Any:
            if not isinstance(name, str) or not name:
                raise ValueError(f"{self.kind} names must be non-empty strings, got {name!r}")
            if params is not None and not (isinstance(params, type) and dataclasses.is_dataclass(params)):
                raise TypeError(f"{self.kind} {name!r}: params must be a dataclass, got {params!r}")
            module = getattr(target, "__module__", "") or ""
            old = self._entries.get(name)
            if old is not None and old.builtin and old.obj is not target:  # built-ins register first
                raise ValueError(f"{self.kind} {name!r} is already registered by {old.module} (fedmpi's own: "
                                 f"register yours under another name)")
            if old is not None and _qualname(old.obj) != _qualname(target):
                raise ValueError(f"{self.kind} {name!r} is already registered by {old.module}")
            self._entries[name] = Entry(name, target, params, check, dict(options), module)
            return target

        return add if obj is None else add(obj)

    def get(self, name: str) -> Entry:
        """The entry of ``name``; InputError naming the config key and the registered names otherwise."""
        if name not in self._entries:
            raise InputError(f"{self.key}: unknown {self.kind} {name!r} (registered: {', '.join(self.names())}; "
                             f"{PLUGIN_HINT})")
        return self._entries[name]

    def names(self, builtin_only: bool = False) -> list[str]:
        return [n for n, e in self._entries.items() if e.builtin or not builtin_only]

    def entries(self, builtin_only: bool = False) -> list[Entry]:
        return [self._entries[n] for n in self.names(builtin_only)]

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry]:
        return iter(self.entries())


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', repr(obj))}"


ALGORITHMS = Registry("algorithm", "algorithm.name")
MODELS = Registry("model", "task.model")
DATASETS = Registry("dataset", "task.dataset")
AVAILABILITY = Registry("availability kind", "availability.kind")
MECHANISMS = Registry("privacy mechanism", "privacy.mechanism")  # fedmpi.privacy.mechanism.register
ADAPTERS = Registry("adapter type", "task.adapter.kind")  # fedmpi.models.adapters.register_adapter
# Every registered callback runs on every rank, at its ``when`` (an option; runner.py):
# "round_start" (the default) fn(run, t) before round t; "round_end" fn(run, t) after it;
# "evaluated" fn(run, rounds_done, row) -> a reason to stop the run early (str) or None.
CALLBACKS = Registry("callback", "plug-in")
METRICS = Registry("metric", "plug-in")  # fn(MetricInput) -> float, on rank 0 (fedmpi.metrics)
