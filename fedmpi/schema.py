"""Declaring config keys: ``opt(default, doc, bounds...)`` for a field of a section dataclass.

Every config section is a dataclass declared by the component that reads it (the local trainer's
``train``, an algorithm's ``algorithm`` block, an availability kind's keys...); ``fedmpi.config``
assembles the root and parses YAML against it. This module imports nothing else of fedmpi, so
any component can declare its keys without pulling in the rest.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

import yaml


def opt(default: Any, doc: str, *, ge: float | None = None, gt: float | None = None,
        le: float | None = None, lt: float | None = None, selects: Any = None, used_by: Any = None,
        result: bool | None = None, resume: bool | None = None, digest: Digest | None = None) -> Any:
    """Declare a config key: default, one-line doc and numeric bounds.

    ``selects`` (a ``fedmpi.registry.Registry``): the key names a component of that registry, and
    its block then takes the chosen component's parameters. ``used_by`` (a Registry): the section
    belongs to the components of that registry that list it in their ``sections``; with none of
    them selected it is ignored (with a notice) and left ``None``.

    The resume rules (``fedmpi.config``; None: as the block or section the key is in, which the root
    declares for each top-level key): ``result`` -- whether the key can change a number the run
    stores (``rounds`` cannot: a longer run's rows are a shorter one's and more); ``resume`` --
    whether it may change when a run is resumed or extended (``rounds``, ``runtime``, ``evaluation``
    may; ``seed``, ``train``, ``algorithm`` may not: those make the resume digest). ``digest``: how
    the key entered the digest of checkpoints written before it existed (``Digest``), history only."""
    meta = {"doc": doc, "ge": ge, "gt": gt, "le": le, "lt": lt, "selects": selects, "used_by": used_by,
            "result": result, "resume": resume, "digest": digest}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda d=default: copy(d), metadata=meta)
    if dataclasses.is_dataclass(default):
        return field(default_factory=type(default), metadata=meta)
    return field(default=default, metadata=meta)


#: ``move_keys``'s "the new key is not there" (a key's value may be None), and ``Digest``'s "no value".
ABSENT = object()


@dataclass(frozen=True)
class Digest:
    """How a key enters the resume digest besides by its value, declared by the keys whose digest
    must stay what checkpoints written before them hold (the history that ``Config`` used to keep by
    hand). A key added now needs none: a checkpoint that does not record a key continues with it at
    its default (``Config.resume_refusals``).

    ``absent``: at this value the key is left out (what runs did before it existed); ``off``: at
    this value its whole block is (a section or block that did not exist); ``when``: hashed only
    when the keys of its block have these values ((key, value) pairs: a parameter of one choice);
    ``at``: hashed at this dotted key instead (where it was declared before), with ``default``
    there where the selected component does not declare it."""

    absent: Any = ABSENT
    off: Any = ABSENT
    when: tuple[tuple[str, Any], ...] = ()
    at: str | None = None
    default: Any = None

    def leaves_out(self, value: Any, block: Any) -> bool:
        """Whether the key, at ``value`` in ``block`` (its dataclass instance), is left out."""
        return (self.absent is not ABSENT and value == self.absent
                or any(getattr(block, k, ABSENT) != v for k, v in self.when))


NO_DIGEST = Digest()


@dataclass(frozen=True)
class Reads:
    """A component's read of a key outside its own block, declared next to the code that reads it
    (an algorithm's, availability kind's or privacy mechanism's ``reads``).

    ``key``: the dotted key; ``why``: what the component does with it (the refusal says it);
    ``supports``: which values it handles (None: any), and ``expect`` what to set instead;
    ``when``: a test of the config (None: always), e.g. privacy reads ``rounds`` only to calibrate
    a target epsilon. ``fedmpi.config`` refuses a config whose value the component does not
    support, naming both keys; a read key outside the resume digest joins it
    (``Config.resume_keys``), so that a resume cannot change what the run depends on."""

    key: str
    why: str
    supports: Callable[[Any], bool] | None = None
    expect: str = ""
    when: Callable[[Any], bool] | None = None

    def applies(self, cfg: Any) -> bool:
        return self.when is None or bool(self.when(cfg))

    def value(self, cfg: Any) -> Any:
        """The key's value in ``cfg`` (None where a section is absent)."""
        out = cfg
        for part in self.key.split("."):
            out = getattr(out, part, None)
        return out


def copy(x: Any) -> Any:
    """A deep copy of plain YAML data."""
    return yaml.safe_load(yaml.safe_dump(x))


#: Keys that moved to the component that reads them: old dotted spelling -> new one
#: (``fedmpi.config`` reads the old one with a notice; readers of stored configs use
#: ``current_spelling``). Here, torch-free, for the commands that only read result files.
MOVED = {"train.global_lr": "algorithm.global_lr"}


def move_keys(data: dict, check: Callable[[str, str, Any, Any], None] | None = None) -> dict:
    """Move each ``MOVED`` old spelling in the nested config ``data`` to its new place, in place,
    and return ``data``. Where the new key is there too it stays (``check(old, new, old value,
    new value)`` may refuse that first); each move calls ``check(old, new, value, ABSENT)``.
    A new section that is not a mapping is left for the config's own error."""
    for old, new in MOVED.items():
        (osec, okey), (nsec, nkey) = old.split("."), new.split(".")
        src = data.get(osec)
        if not isinstance(src, dict) or okey not in src:
            continue
        dst = data.get(nsec)
        if dst is None:  # absent, or an empty YAML block
            dst = data[nsec] = {}
        if not isinstance(dst, dict):
            continue
        if check is not None:
            check(old, new, src[okey], dst.get(nkey, ABSENT))
        dst.setdefault(nkey, src.pop(okey))
    return data


def dotted(key: str, value: Any) -> list[tuple[str, Any]]:
    """An override as dotted keys: a non-empty mapping sets the keys it names and keeps the
    section's others (``privacy={mechanism: gaussian}`` -> ``privacy.mechanism``), as a sweep's
    ``set:`` does; any other value, ``{}`` included (the section's defaults), replaces the key."""
    if not isinstance(value, dict) or not value:
        return [(key, value)]
    return [pair for k, v in value.items() for pair in dotted(f"{key}.{k}", v)]


def current_spelling(data: dict) -> dict:
    """A copy of the nested config ``data`` (e.g. one stored in an old result file) with every
    ``MOVED`` key at its new place, silently (``move_keys``). Readers use it so that runs made
    before and after a key moved compare as the same experiment."""
    return move_keys({k: dict(v) if isinstance(v, dict) else v for k, v in data.items()})
