"""Safe reading of YAML and JSON input: configs, ``--set`` values, traces, checkpoint manifests.

YAML becomes plain data (mappings, lists, strings, numbers, booleans, null) under YAML 1.2's
core schema: ``1e-3``, ``5E4`` and ``0x1F`` are numbers; YAML 1.1's sexagesimal ``1:30``,
``yes``/``no``/``on``/``off`` and dates stay strings (a typed config key then names them).
Merge keys (``<<: *base``) are honoured. The document is built from the parser's event stream
without recursion, and refused -- ``InputError`` (exit 2) naming the source and the key path --
as soon as it

- repeats a key in one mapping (``c.yaml: duplicate key train.lr (lines 4 and 9)``);
- nests deeper than ``MAX_DEPTH`` levels;
- holds more than ``MAX_NODES`` values with every alias counted at the size of what it names
  and a scalar of n characters counted as 1 + n // ``CHARS_PER_VALUE`` values (a "billion
  laughs" file, of short or of long strings, is refused after one pass over its text, before
  anything expands);
- carries a tag other than the standard str/int/float/bool/null/seq/map ones, or a second
  document.

JSON gets the same nesting limit (counted on the raw text, before parsing) and the
duplicate-key check. Files larger than ``MAX_FILE_BYTES`` are refused before reading.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Iterator

import numpy as np
import yaml

from .errors import InputError
from .inputs import read_input

MAX_DEPTH = 64  # nested collections (a config needs 4: root > availability > schedule > row)
MAX_NODES = 1_000_000  # values after alias expansion
CHARS_PER_VALUE = 64  # a scalar of n characters counts 1 + n // 64 values (64 MB of text at most)
MAX_FILE_BYTES = 64 * 2**20  # YAML/JSON text read whole (traces have their own limit)

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's parser when present
_TAG = "tag:yaml.org,2002:"

# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution)
_NULL = re.compile(r"~|null|Null|NULL|")
_BOOL = {"true": True, "True": True, "TRUE": True, "false": False, "False": False, "FALSE": False}
_INT = re.compile(r"[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+")
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_INF = re.compile(r"[-+]?\.(inf|Inf|INF)")
_NAN = re.compile(r"\.(nan|NaN|NAN)")


class _Refuse(Exception):
    """A problem at one place of the document; becomes ``InputError("<source>: ...")``."""


def _int(text: str) -> int:
    t = text.lstrip("+")
    try:
        if t.startswith("0o"):
            return int(t[2:], 8)
        if t.startswith("0x"):
            return int(t[2:], 16)
        return int(t)
    except ValueError:  # Python refuses decimal strings of more than 4300 digits
        raise _Refuse(f"integer of {len(t)} digits is too long") from None


def _float(text: str) -> float:
    if _NAN.fullmatch(text):
        return math.nan
    if _INF.fullmatch(text):
        return -math.inf if text.startswith("-") else math.inf
    return float(text)


def _plain(text: str) -> Any:
    """An untagged plain scalar under the core schema."""
    if _NULL.fullmatch(text):
        return None
    if text in _BOOL:
        return _BOOL[text]
    if _INT.fullmatch(text):
        return _int(text)
    if _FLOAT.fullmatch(text) or _INF.fullmatch(text) or _NAN.fullmatch(text):
        return _float(text)
    return text


def _tagged(tag: str, text: str) -> Any:
    """A scalar with an explicit standard tag (``!!str 12``, ``!!float 1``)."""
    kind = tag[len(_TAG):]
    if kind not in ("str", "null", "bool", "int", "float"):
        raise _Refuse(f"unsupported tag !!{kind}")
    if kind == "str":
        return text
    if kind == "null" and _NULL.fullmatch(text):
        return None
    if kind == "bool" and text in _BOOL:
        return _BOOL[text]
    if kind == "int" and _INT.fullmatch(text):
        return _int(text)
    if kind == "float" and (_INT.fullmatch(text) or _FLOAT.fullmatch(text) or _INF.fullmatch(text)
                            or _NAN.fullmatch(text)):
        return float(_int(text)) if _INT.fullmatch(text) else _float(text)
    raise _Refuse(f"{text[:40]!r} is not a valid !!{kind}")


class _Frame:
    """An open mapping or sequence while its events arrive."""

    __slots__ = ("value", "path", "anchor", "start", "height", "key", "key_line", "lines", "merges")

    def __init__(self, value: dict | list, path: str, anchor: str | None, start: int):
        self.value, self.path, self.anchor, self.start = value, path, anchor, start
        self.height = 1  # levels of nesting at and below this collection
        self.key: Any = _NO_KEY  # mapping: the key waiting for its value
        self.key_line = 0
        self.lines: dict = {}  # mapping: key -> line it appeared on
        self.merges: list[dict] = []


_NO_KEY = object()


class _Builder:
    """Plain data from YAML events, with the limits of the module docstring."""

    def __init__(self):
        self.stack: list[_Frame] = []
        self.anchors: dict[str, tuple[Any, int, int]] = {}  # name -> (value, expanded size, height)
        self.open_anchors: set[str] = set()
        self.count = 0  # values so far, aliases expanded
        self.documents = 0
        self.result: Any = None

    def where(self) -> str:
        """The path of the value being read, shortened for messages."""
        path = self.child_path() or "top"
        return path if len(path) <= 80 else path[:50] + "..." + path[-27:]

    def child_path(self) -> str:
        if not self.stack:
            return ""
        f = self.stack[-1]
        if isinstance(f.value, list):
            return f"{f.path}[{len(f.value)}]"
        if f.key is _NO_KEY:
            return f.path
        key = f.key if isinstance(f.key, str) else repr(f.key)
        return f"{f.path}.{key}" if f.path else key

    def add(self, value: Any, line: int, size: int, height: int) -> None:
        self.count += size
        if self.count > MAX_NODES:
            raise _Refuse(f"more than {MAX_NODES} values once aliases are expanded (at {self.where()})")
        if len(self.stack) + height > MAX_DEPTH:
            raise _Refuse(f"nested deeper than {MAX_DEPTH} levels (at {self.where()})")
        if not self.stack:
            self.result = value
            return
        f = self.stack[-1]
        f.height = max(f.height, height + 1)
        if isinstance(f.value, list):
            f.value.append(value)
        elif f.key is _NO_KEY:
            try:
                hash(value)
            except TypeError:
                raise _Refuse(f"a mapping key must be a scalar (at {f.path or 'top'}, line {line + 1})") from None
            f.key, f.key_line = value, line
        else:
            self.put(f, value)

    def put(self, f: _Frame, value: Any) -> None:
        key, path = f.key, self.where()
        f.key = _NO_KEY
        if key == "<<":
            merged = value if isinstance(value, list) else [value]
            if not all(isinstance(m, dict) for m in merged):
                raise _Refuse(f"a merge key (<<) takes a mapping or a list of mappings (at {path})")
            f.merges += merged
            return
        if key in f.lines:
            raise _Refuse(f"duplicate key {path} (lines {f.lines[key] + 1} and {f.key_line + 1})")
        f.lines[key] = f.key_line
        f.value[key] = value

    @staticmethod
    def scalar(ev: yaml.ScalarEvent) -> Any:
        if ev.tag is None:
            return _plain(ev.value) if ev.implicit[0] else ev.value  # quoted: a string
        if ev.tag == "!":
            return ev.value
        if ev.tag.startswith(_TAG):
            return _tagged(ev.tag, ev.value)
        raise _Refuse(f"unsupported tag {ev.tag}")

    def event(self, ev: yaml.Event) -> None:
        line = ev.start_mark.line if ev.start_mark is not None else 0
        if isinstance(ev, yaml.DocumentStartEvent):
            self.documents += 1
            if self.documents > 1:
                raise _Refuse(f"a second YAML document at line {line + 1} (expected one)")
        elif isinstance(ev, yaml.ScalarEvent):
            try:
                value = self.scalar(ev)
            except _Refuse as e:
                raise _Refuse(f"{e} (at {self.where()}, line {line + 1})") from None
            size = 1 + len(ev.value) // CHARS_PER_VALUE  # a long string counts as many values
            if ev.anchor:
                self.anchors[ev.anchor] = (value, size, 0)
            self.add(value, line, size, 0)
        elif isinstance(ev, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            seq = isinstance(ev, yaml.SequenceStartEvent)
            if ev.tag not in (None, "!", _TAG + ("seq" if seq else "map")):
                raise _Refuse(f"unsupported tag {ev.tag} (at {self.where()}, line {line + 1})")
            if len(self.stack) + 1 > MAX_DEPTH:
                raise _Refuse(f"nested deeper than {MAX_DEPTH} levels (at {self.where()}, "
                              f"line {line + 1})")
            self.count += 1
            self.stack.append(_Frame([] if seq else {}, self.child_path(), ev.anchor, self.count))
            if ev.anchor:
                self.open_anchors.add(ev.anchor)
        elif isinstance(ev, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            f = self.stack.pop()
            value = f.value
            if f.merges:
                value = {}
                for m in reversed(f.merges):  # earlier merged mappings win, explicit keys win over all
                    value.update(m)
                value.update(f.value)
            size = self.count - f.start + 1
            self.count = f.start - 1  # add() counts the finished collection again, in one piece
            if f.anchor:
                self.open_anchors.discard(f.anchor)
                self.anchors[f.anchor] = (value, size, f.height)
            self.add(value, line, size, f.height)
        elif isinstance(ev, yaml.AliasEvent):
            if ev.anchor in self.open_anchors:
                raise _Refuse(f"alias *{ev.anchor} inside the collection it names (line {line + 1})")
            if ev.anchor not in self.anchors:
                raise _Refuse(f"undefined alias *{ev.anchor} (line {line + 1})")
            value, size, height = self.anchors[ev.anchor]
            self.add(value, line, size, height)


def _events(text: str, loader_class: type = _Loader) -> Iterator[yaml.Event]:
    loader = loader_class(text)
    try:
        while loader.check_event():
            yield loader.get_event()
    finally:
        loader.dispose()


def loads(text: str | bytes, source: str) -> Any:
    """One YAML document -> plain data; ``InputError("<source>: ...")`` on any problem."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8-sig")
        except UnicodeDecodeError as e:
            raise InputError(f"{source}: not UTF-8 text (byte {e.start})") from None
    loaders = [_Loader] if _Loader is yaml.SafeLoader else [_Loader, yaml.SafeLoader]
    for loader in loaders:
        try:
            return _build(text, loader)
        except _Refuse as e:
            raise InputError(f"{source}: {e}") from None
        except yaml.YAMLError as e:
            # libyaml refuses some documents before their events reach the builder (PyYAML >= 6.0.4's
            # nesting limit, met while it scans ahead): parsed again by the pure-Python parser, which
            # has no such limit, the builder's own checks run first and name the key path
            if loader is loaders[-1]:
                raise _malformed(source, e) from None
    raise AssertionError("unreachable")


def _build(text: str, loader_class: type) -> Any:
    b = _Builder()
    for ev in _events(text, loader_class):
        b.event(ev)
    return b.result


def _malformed(source: str, e: yaml.YAMLError) -> InputError:
    """A parser's error as one line naming ``source``, the line and the problem."""
    mark = getattr(e, "problem_mark", None)
    where = f" at line {mark.line + 1}" if mark is not None else ""
    problem = getattr(e, "problem", None)
    return InputError(f"{source}: malformed YAML{where}" + (f" ({problem})" if problem else ""))


def read_text(path: str, what: str, limit: int = MAX_FILE_BYTES) -> bytes:
    """The bytes of ``path`` (at most ``limit``; a special file is refused unopened,
    ``fedmpi.inputs``); InputError naming the file otherwise."""
    try:
        return read_input(path, what, limit=limit)
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found") from None
    except IsADirectoryError:
        raise InputError(f"{path}: is a directory, expected a {what}") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read {what} ({e.__class__.__name__})") from None


def load_file(path: str, what: str = "YAML file") -> Any:
    """``loads`` of a file, whose problems (missing, unreadable, too big) name it too."""
    return loads(read_text(path, what), path)


# ----------------------------------------------------------------------------- JSON

_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_OPEN = np.zeros(256, dtype=np.int8)
_OPEN[[ord("["), ord("{")]] = 1
_OPEN[[ord("]"), ord("}")]] = -1


def json_depth(data: bytes) -> int:
    """Deepest bracket nesting of JSON text (strings skipped), without parsing it."""
    text = _JSON_STRING.sub(b'""', data)
    deepest, level = 0, 0
    for i in range(0, len(text), 1 << 20):
        steps = _OPEN[np.frombuffer(text, dtype=np.uint8, count=min(1 << 20, len(text) - i), offset=i)]
        levels = np.cumsum(steps, dtype=np.int64) + level
        if levels.size:
            deepest, level = max(deepest, int(levels.max())), int(levels[-1])
    return deepest


def loads_json(data: str | bytes, source: str) -> Any:
    """JSON -> data, refusing deep nesting and repeated keys; ``InputError("<source>: ...")``."""
    raw = data.encode() if isinstance(data, str) else data
    depth = json_depth(raw)
    if depth > MAX_DEPTH:
        raise InputError(f"{source}: JSON nested {depth} levels deep, more than the {MAX_DEPTH} allowed")

    def pairs(items: list[tuple[str, Any]]) -> dict:
        out: dict = {}
        for k, v in items:
            if k in out:
                raise _Refuse(f"duplicate key {k[:60]!r}")
            out[k] = v
        return out

    try:
        return json.loads(raw, object_pairs_hook=pairs)
    except _Refuse as e:
        raise InputError(f"{source}: {e}") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, too many digits
        detail = str(e).splitlines()[0][:120] if str(e) else e.__class__.__name__
        raise InputError(f"{source}: malformed JSON ({detail})") from None
