"""What an algorithm can do, gathered in one place (#43 item 3).

``capabilities(cls)`` answers, for a registered algorithm class: what it trains, what state it
keeps where, which hooks of the round it overrides and which keys of other sections it reads.
Each answer comes from one declaration of the class (or is derived, never declared twice):

- state: ``shared_state`` and ``custom_state`` (the server's, or the same on every rank) and
  ``client_state`` (a row per client, on the rank that owns it) -- ``fedmpi.state``;
- reads: ``reads`` (``fedmpi.schema.Reads``: keys of other sections with the values it supports) and
  ``uses`` (keys of other sections its code reads whatever their value, e.g. the server's
  ``availability.size`` under over-selection; a section name covers its keys; a class adds to its
  bases' like state). Its own block (``algorithm``) and its own ``sections`` need no declaration;
  tests/test_capabilities.py runs every built-in and example algorithm on a config that records
  what it reads and fails on any other key;
- hooks: the hooks of ``base.HOOKS`` it overrides and the switches of ``base.SWITCHES`` it sets,
  found where they are defined (``ServerAlgorithm._overridden``); the mode honours each or
  ``register`` refuses it (``ServerAlgorithm._unhonoured``);
- ``packs``, derived: its round is ``ServerAlgorithm``'s three phases, so a packed sweep
  (``fedmpi.packed``) may train its clients with other runs' (an asynchronous server step is not).

``check(cls)`` validates the declarations at ``register`` (a TypeError naming the class and the
attribute): each state name declared once, ``uses`` a tuple of dotted keys outside its own block,
no ``packs``.

``scoped(cfg, cls)`` is the config an algorithm gets (``Context.cfg``, so also ``self.cfg``): its
own block and sections and the keys it declares (``reads``, ``uses``), nothing else. Reading any
other key raises ``UndeclaredRead`` (an ``InputError``: exit 2, one line naming the key, the
algorithm and the fix), at the first read, on every rank alike. ``check_config`` (a classmethod,
before set-up) still gets the whole config: it refuses combinations, naming each key it reads.
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import Any

from ..errors import InputError
from ..state import DECLARATIONS, declared


@dataclass(frozen=True)
class Capabilities:
    """What an algorithm class trains and keeps, the hooks it overrides and what it reads."""

    trains: str  # "server model": x^t from the clients' updates; "client models": each client its own
    server_state: tuple[str, ...]  # shared_state and custom_state
    client_state: tuple[str, ...]  # one row per client, on its owner's rank
    hooks: tuple[str, ...]  # the round's hooks it overrides and switches it sets
    reads: tuple[str, ...]  # keys (or sections) of other sections it reads
    packs: bool  # derived: its round is the three phases (a packed sweep may train it with others)


def capabilities(cls: type) -> Capabilities:
    """The capabilities of the algorithm class ``cls`` (module docstring)."""
    S = _server_base(cls)
    server = S is not None
    return Capabilities(
        trains="server model" if server else "client models",
        server_state=tuple(declared(cls, "shared_state") + declared(cls, "custom_state")),
        client_state=tuple(declared(cls, "client_state")),
        hooks=tuple(cls._overridden()) if server else (),
        reads=tuple(dict.fromkeys([*(r.key for r in cls.reads), *declared(cls, "uses")])),
        packs=server and all(getattr(cls, m) is getattr(S, m) for m in ("round", "begin_round", "finish_round")))


def _server_base(cls: type) -> type | None:
    """``ServerAlgorithm`` when ``cls`` is one (the first class of its bases that finds the hooks it
    overrides), else None; found, not imported, because ``base.register`` calls ``check`` of this module."""
    return next((k for k in reversed(cls.__mro__) if "_overridden" in vars(k)), None)


def check(cls: type, name: str) -> None:
    """Refuse (TypeError) declarations that contradict each other: a state name declared in two
    kinds, a ``uses`` that is not a tuple of dotted keys of other sections, a declared ``packs``."""
    seen: dict[str, str] = {}
    for kind in DECLARATIONS:
        for attr in vars(cls).get(kind, ()):
            if attr in seen and seen[attr] != kind:
                raise TypeError(f"algorithm {name!r}: {cls.__name__} declares {attr!r} in both {seen[attr]} and {kind}")
            seen[attr] = kind
    if "packs" in vars(cls):
        raise TypeError(f"algorithm {name!r}: {cls.__name__}.packs is derived from its round (capabilities), "
                        f"not declared")
    uses = vars(cls).get("uses", ())
    own = ("algorithm", *cls.sections)
    if not isinstance(uses, tuple) or not all(isinstance(k, str) and k for k in uses):
        raise TypeError(f"algorithm {name!r}: {cls.__name__}.uses must be a tuple of dotted config keys")
    for key in uses:
        if key.split(".")[0] in own:
            raise TypeError(f"algorithm {name!r}: {cls.__name__}.uses names {key!r}, a key of its own block or "
                            f"sections (declare only keys of other sections)")


def readable(cls: type) -> tuple[str, ...]:
    """The dotted keys (a section covers its keys) that ``cls`` may read: its own block and
    sections, and its declared reads."""
    return ("algorithm", *cls.sections, *capabilities(cls).reads)


def reads_within(cls: type, key: str) -> bool:
    """Whether ``cls`` may read the dotted ``key`` (``readable``)."""
    return _covered(key, readable(cls))


def _covered(key: str, allowed: tuple[str, ...]) -> bool:
    return any(key == r or key.startswith(r + ".") for r in allowed)


class UndeclaredRead(InputError):
    """An algorithm read a config key it did not declare (``ScopedConfig``): a plug-in's mistake,
    shown as bad input (exit 2, one line) because its author meets it running fedmpi."""


class ScopedConfig:
    """A read-only view of the run's config (or of one of its blocks) for one algorithm: a key it
    may read (``readable``) is the config's own value (a whole section its own dataclass); a block
    holding some readable keys is a view of that block; any other key raises ``UndeclaredRead``."""

    def __init__(self, block: Any, path: str, allowed: tuple[str, ...], who: str, uses: str):
        vars(self).update(_block=block, _path=path, _allowed=allowed, _who=who, _uses=uses, _views={})

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # Python's own protocols (copy, pickle) find nothing here
            raise AttributeError(name)
        key = self._path + name
        if _covered(key, self._allowed):
            return getattr(self._block, name)
        if any(r.startswith(key + ".") for r in self._allowed):
            if name not in self._views:
                value = getattr(self._block, name)
                self._views[name] = value if value is None else ScopedConfig(value, key + ".", self._allowed,
                                                                                 self._who, self._uses)
            return self._views[name]
        raise UndeclaredRead(f"{key}: {self._who} reads this key without declaring it (add {key!r} to {self._uses})")

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{self._path}{name}: the config is read-only")

    def __repr__(self) -> str:
        return f"ScopedConfig({self._path.rstrip('.') or 'config'} of {self._who})"


def scoped(cfg: Any, cls: type) -> ScopedConfig:
    """``cfg`` as the algorithm class ``cls`` may read it (``Context.cfg``; module docstring)."""
    return ScopedConfig(cfg, "", readable(cls), f"algorithm {cfg.algorithm.name!r}", f"{cls.__name__}.uses")
