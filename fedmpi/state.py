"""Checkpointable state, declared once.

A component (an algorithm, a participation model) lists the attributes that make up its state:

- ``shared_state``: identical on every rank, or used by the server (rank 0) only -- saved from
  rank 0, restored on every rank;
- ``client_state``: one row per client of this rank's shard [lo, hi), in id order -- saved by
  every rank and re-sharded on resume, onto any number of ranks.

Each class lists only what it adds: the declarations of its base classes are kept. Values
may be numpy arrays, tensors or Python numbers (a Python float is saved as float64); a dotted name
reaches into an object (``table.rows``). Every other attribute is declared too, so that nothing a
checkpoint loses can go unnoticed:

- ``custom_state``: state the class saves itself, by extending ``state_dict``/``load_state_dict``
  (FedSWE's model versions, the scheduler's clock);
- ``components``: ``Stateful`` objects (or None) whose state is saved with this one's, each under the
  keys it names: its own, prefixed with its class's ``state_prefix`` (the server's scheduler and
  privacy, privacy's clip, mechanism and ledger) -- nobody merges their state by hand;
- ``derived``: recomputed from the config, the task or the declared state (caches, scratch
  buffers, the last round's cohort), so a resume that recomputes it loses nothing;
- ``configuration``: fixed at set-up (from the config, the task, the run's components) and never
  reassigned (a learning rate, the number of clients, the world); not arrays or tensors, which
  are state or derived.

``undeclared`` finds any other attribute, scalars included (a plug-in's step counter kept in a
plain int would silently restart at a resume, issue #44), and ``settings``/``changed_settings``
a configuration attribute that a round reassigned; the run refuses either (exit 2, one line naming
the attribute) after set-up and again after the first round, before any checkpoint
(``fedmpi.build.check_state``). A ``Stateful`` object an attribute holds (the privacy component)
answers for its own arrays and tensors.
``Stateful.state_dict`` turns the declared state into tensors (``State``) and
``load_state_dict`` restores each one as the type, dtype, device and shape the attribute has
now -- this is the only place where state moves between numpy and torch. A component with
state of another shape (FedSWE's shared model versions) extends both methods, uses
``State.union`` and lists the attribute in ``custom_state``.
"""

from __future__ import annotations

import copy
import operator
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np
import torch

from .errors import InputError


@dataclass
class State:
    """The tensors of one component: ``shared`` (written by rank 0, read by every rank),
    ``clients`` (this rank's rows; re-sharded on load) and ``union`` (each rank holds a subset,
    identical where they overlap; every rank reads all of them). The tensors may be views of
    the live state: save them before the next round changes it."""

    shared: dict[str, torch.Tensor] = field(default_factory=dict)
    clients: dict[str, torch.Tensor] = field(default_factory=dict)
    union: dict[str, torch.Tensor] = field(default_factory=dict)

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(``KIND/NAME``, tensor) of every entry, KIND one of shared, client, union."""
        for kind, attr in _KINDS.items():
            yield from ((f"{kind}/{name}", t) for name, t in getattr(self, attr).items())

    def put(self, key: str, tensor: torch.Tensor) -> None:
        """The inverse of ``items``: file ``tensor`` under ``KIND/NAME`` (ValueError for another key)."""
        kind, _, name = key.partition("/")
        if kind not in _KINDS or not name:
            raise ValueError(f"not a state key: {key!r}")
        getattr(self, _KINDS[kind])[name] = tensor


_KINDS = {"shared": "shared", "client": "clients", "union": "union"}  # the word in keys -> field


class Stateful:
    """Mixin: ``state_dict``/``load_state_dict`` from the declared attribute names."""

    shared_state: tuple[str, ...] = ()
    client_state: tuple[str, ...] = ()
    custom_state: tuple[str, ...] = ()  # saved by the class's own ``state_dict`` extension
    components: tuple[str, ...] = ()  # Stateful objects (or None) saved with it, under their ``state_prefix``
    derived: tuple[str, ...] = ()  # recomputed from the config, the task or the state; not saved
    configuration: tuple[str, ...] = ()  # fixed at set-up, never reassigned; not saved
    state_prefix: str = ""  # what this object's keys start with when it is another's component

    def state_dict(self) -> State:
        state = State(shared={n: state_value(self, n) for n in declared(type(self), "shared_state")},
                      clients={n: state_value(self, n) for n in declared(type(self), "client_state")})
        for part in self._components():
            theirs = part.state_dict()
            for attr in _KINDS.values():
                getattr(state, attr).update({part.state_prefix + k: v for k, v in getattr(theirs, attr).items()})
        return state

    def load_state_dict(self, state: State) -> None:
        for kind, saved in (("shared_state", state.shared), ("client_state", state.clients)):
            for name in declared(type(self), kind):
                if name not in saved:
                    raise InputError(f"checkpoint: no saved state {name!r} for {type(self).__name__} "
                                     f"(was it written by another version?)")
                _set(self, name, restore_like(_get(self, name), saved[name], name))
        for part in self._components():
            p = part.state_prefix
            part.load_state_dict(state if not p else State(
                **{attr: {k[len(p):]: v for k, v in getattr(state, attr).items() if k.startswith(p)}
                   for attr in _KINDS.values()}))

    def _components(self) -> list[Stateful]:
        """The declared ``components`` that are set (a None one holds no state)."""
        return [c for c in (_get(self, n) for n in declared(type(self), "components")) if c is not None]


def declared(cls: type, kind: str) -> list[str]:
    """The names ``cls`` and its base classes declare in ``kind`` (``shared_state``/``client_state``)."""
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        names += [n for n in vars(klass).get(kind, ()) if n not in names]
    return names


#: the declarations of an attribute, weakest first: a subclass may declare state under a name its
#: base class declared configuration (FedAdam's moment ``m`` over the number of clients)
DECLARATIONS = ("configuration", "derived", "components", "custom_state", "client_state", "shared_state")


def declarations(cls: type) -> dict[str, str]:
    """{attribute: its declaration (``DECLARATIONS``)} of ``cls`` and its base classes (a dotted
    state name declares its first part)."""
    return {n.split(".")[0]: kind for kind in DECLARATIONS for n in declared(cls, kind)}


def undeclared(obj: Any, strict: bool = True) -> list[str]:
    """The attributes of ``obj`` that are neither declared state, derived nor configuration (with
    ``strict=False``: only those holding arrays or tensors, or lists, tuples or dicts of them), and
    configuration attributes holding arrays or tensors; with those of the ``Stateful`` objects it
    holds, non-strictly (as ``attribute.name``)."""
    kinds = declarations(type(obj))
    found = []
    for name, value in vars(obj).items():
        if isinstance(value, Stateful):
            found += [f"{name}.{inner}" for inner in undeclared(value, strict=False)]
        kind = kinds.get(name)
        if kind is None and (strict or _holds_arrays(value)) or kind == "configuration" and _holds_arrays(value):
            found.append(name)
    return found


def settings(obj: Any) -> dict[str, Any]:
    """The values of ``obj``'s configuration attributes now: plain data (numbers, strings, None and
    lists, tuples, dicts of them) as a copy, any other object as its identity."""
    kinds = declarations(type(obj))
    return {n: _setting(v) for n, v in vars(obj).items() if kinds.get(n) == "configuration"}


def changed_settings(obj: Any, before: dict[str, Any]) -> list[str]:
    """The configuration attributes of ``obj`` whose value is not the one ``settings`` recorded."""
    now = settings(obj)
    return [n for n in dict.fromkeys([*before, *now]) if n not in now or n not in before or now[n] != before[n]]


def _setting(value: Any) -> Any:
    if _plain(value):
        return ("value", copy.deepcopy(value))
    return ("object", id(value))


def _plain(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str, np.number)):
        return True
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(_plain(v) for v in value)
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    return False


def _holds_arrays(value: Any) -> bool:
    if isinstance(value, (np.ndarray, torch.Tensor)):
        return True
    if isinstance(value, (list, tuple)):
        return any(_holds_arrays(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_arrays(v) for v in value.values())
    return False


def state_tensors(obj: Any) -> list[torch.Tensor]:
    """The declared state values of ``obj`` that are tensors (the live objects, not copies)."""
    names = declared(type(obj), "shared_state") + declared(type(obj), "client_state")
    values = (_get_or_none(obj, n) for n in names)  # a missing one is state_value's to name
    return [v for v in values if isinstance(v, torch.Tensor)]


def as_tensor(value: Any) -> torch.Tensor:
    """A state value as a tensor (numpy arrays share their memory)."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, float):  # torch would make a Python float float32
        return torch.tensor(value, dtype=torch.float64)
    if isinstance(value, (bool, int, np.number)):
        return torch.tensor(value)
    raise TypeError(f"state values must be arrays, tensors or numbers, got {type(value).__name__}")


def state_value(obj: Any, name: str) -> torch.Tensor:
    """The declared state ``name`` of ``obj`` as a tensor (``as_tensor``); InputError naming it when
    ``obj`` has no such attribute or its value is no array, tensor or number a checkpoint can hold
    (a string, None, a Decimal, an int beyond 64 bits)."""
    try:
        value = _get(obj, name)
    except AttributeError:
        raise InputError(f"{type(obj).__name__} declares {name!r} state but has no such attribute (set it in "
                         f"__init__ and keep it; a checkpoint saves every declared name)") from None
    try:
        return as_tensor(value)
    except (TypeError, ValueError, OverflowError, RuntimeError):  # ValueError/RuntimeError: an int beyond int64
        raise InputError(f"{type(obj).__name__} keeps {type(value).__name__} {str(value)[:40]!r} as declared state "
                         f"{name!r}: a checkpoint holds arrays, tensors and numbers (bool, int of 64 bits, float) "
                         f"only") from None


def restore_like(current: Any, saved: torch.Tensor, name: str) -> Any:
    """``saved`` as a fresh copy of the type, dtype, device and shape of ``current``."""
    shape = tuple(np.shape(current)) if not isinstance(current, torch.Tensor) else tuple(current.shape)
    if tuple(saved.shape) != shape:
        raise InputError(f"checkpoint: {name} has shape {tuple(saved.shape)}, expected {shape}")
    if isinstance(current, torch.Tensor):
        return saved.to(device=current.device, dtype=current.dtype, copy=True)
    if isinstance(current, np.ndarray):
        return saved.cpu().numpy().astype(current.dtype, copy=True)
    return type(current)(saved.item())


def _get_or_none(obj: Any, name: str) -> Any:
    try:
        return _get(obj, name)
    except AttributeError:
        return None


def _get(obj: Any, name: str) -> Any:
    return operator.attrgetter(name)(obj)


def _set(obj: Any, name: str, value: Any) -> None:
    owner, _, attr = name.rpartition(".")
    setattr(_get(obj, owner) if owner else obj, attr, value)
