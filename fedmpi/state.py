"""Checkpointable state, declared once.

A component (an algorithm, a participation model) lists the attributes that make up its state:

- ``shared_state``: identical on every rank, or used by the server (rank 0) only -- saved from
  rank 0, restored on every rank;
- ``client_state``: one row per client of this rank's shard [lo, hi), in id order -- saved by
  every rank and re-sharded on resume, onto any number of ranks.

Each class lists only what it adds: the declarations of its base classes are kept. Values
may be numpy arrays, tensors or Python numbers; a dotted name reaches into an object
(``table.rows``). ``derived`` lists the array or tensor attributes that are NOT state: caches and
scratch buffers recomputed from the config, the task or the declared state. Any other array or
tensor attribute would silently be lost at a resume, so ``undeclared`` finds it and the run refuses
it (exit 2), after set-up and again after the first round, before any checkpoint.
``Stateful.state_dict`` turns them into tensors (``State``) and
``load_state_dict`` restores each one as the type, dtype, device and shape the attribute has
now -- this is the only place where state moves between numpy and torch. A component with
state of another shape (FedSWE's shared model versions) extends both methods and uses
``State.union``.
"""

from __future__ import annotations

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
    derived: tuple[str, ...] = ()  # array/tensor attributes recomputed, not saved

    def state_dict(self) -> State:
        return State(shared={n: as_tensor(_get(self, n)) for n in declared(type(self), "shared_state")},
                     clients={n: as_tensor(_get(self, n)) for n in declared(type(self), "client_state")})

    def load_state_dict(self, state: State) -> None:
        for kind, saved in (("shared_state", state.shared), ("client_state", state.clients)):
            for name in declared(type(self), kind):
                if name not in saved:
                    raise InputError(f"checkpoint: no saved state {name!r} for {type(self).__name__} "
                                     f"(was it written by another version?)")
                _set(self, name, restore_like(_get(self, name), saved[name], name))


def declared(cls: type, kind: str) -> list[str]:
    """The names ``cls`` and its base classes declare in ``kind`` (``shared_state``/``client_state``)."""
    names: list[str] = []
    for klass in reversed(cls.__mro__):
        names += [n for n in vars(klass).get(kind, ()) if n not in names]
    return names


def undeclared(obj: Any) -> list[str]:
    """The attributes of ``obj`` that hold arrays or tensors (or lists, tuples or dicts of them) but
    are neither declared state nor ``derived``, with those of the ``Stateful`` objects it holds
    (as ``attribute.name``)."""
    names = {n.split(".")[0] for kind in ("shared_state", "client_state", "derived") for n in declared(type(obj), kind)}
    found = []
    for name, value in vars(obj).items():
        if isinstance(value, Stateful):
            found += [f"{name}.{inner}" for inner in undeclared(value)]
        elif name not in names and _holds_arrays(value):
            found.append(name)
    return found


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
    return [v for v in (_get(obj, n) for n in names) if isinstance(v, torch.Tensor)]


def as_tensor(value: Any) -> torch.Tensor:
    """A state value as a tensor (numpy arrays share their memory)."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, (bool, int, float, np.number)):
        return torch.tensor(value)
    raise TypeError(f"state values must be arrays, tensors or numbers, got {type(value).__name__}")


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


def _get(obj: Any, name: str) -> Any:
    return operator.attrgetter(name)(obj)


def _set(obj: Any, name: str, value: Any) -> None:
    owner, _, attr = name.rpartition(".")
    setattr(_get(obj, owner) if owner else obj, attr, value)
