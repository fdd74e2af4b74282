"""Sweep files: many runs of one base config, each cell in its own result file (read here; run
by ``fedmpi.sweeprun``; ``fedmpi sweep`` is ``fedmpi.sweep``; ``fedmpi table`` reads the cells' files).

A sweep file::

    base: fmnist_sine.yaml            # the config every cell starts from
    out: ../../runs/fmnist_sine       # folder of the cells' result files (default runs/<sweep name>)
    plugins: [qffl.py]                # plug-ins the cells need (loaded before any cell's config is read)
    set:                              # overrides for every cell (dotted keys)
      rounds: 200
      runtime.threads: 1
    variants:                         # a list of override sets, each with an optional label
      - {label: fedswe_k100, algorithm.name: fedswe, algorithm.k: 100}
      - {label: fedavg, algorithm.name: fedavg_active, train.lr: 0.05}
    grid:                             # every combination of these values, for every variant
      seed: [0, 1, 2]
      train.local_steps: [1, 5]
    labels:                           # readable names in tables and legends (results/names.py)
      variant: method                 # the variants' column
      train.local_steps: {name: local steps, values: {1: "one step"}}
    table: {...}                      # what ``fedmpi table SWEEP.yaml`` prints (results/table.py)
    pack: 8                           # cells trained together in one process (fedmpi.packed; default 1)

Cells are variants x grid, in that order (variant outer); cell ``i`` is the same on every
machine, so ``--index i`` (a SLURM array task) names one cell. A cell's result file is
``OUT/<variant label or its key=value list>/<grid key=value list>.h5``, e.g.
``runs/fmnist_sine/fedswe_k100/seed=0.h5``. Each cell's config gets its variant's label as
``runtime.label`` (unless the sweep sets that key), so its result file names its variant wherever
it is read from, alone or with any other files.

Paths in a sweep file (``base``, ``out``, ``plugins``) are relative to the sweep file's folder,
so every command reads the same cells from any working directory; paths on the command line
(``--out``, ``--folder``) are relative to the working directory (docs/SWEEPS.md).

A cell's state (:func:`cell_state`) is read from its result file: done, running (another
process holds its lock), interrupted, failed, not started, or outdated (its config is no longer
the cell's, or a plug-in or data file that made it changed: ``fedmpi.provenance``).
"""

from __future__ import annotations

import itertools
import math
import os
from dataclasses import dataclass, field
from typing import Any

from .. import log, provenance, yamlio
from ..errors import InputError
from ..schema import dotted
from .names import KeyLabel, same_value
from .paths import assignments, value_text

_TOP_KEYS = ("base", "out", "plugins", "set", "variants", "grid", "labels", "table", "pack")
MAX_CELLS = 100_000  # checked before any cell is made (a SLURM array is at most this long, too)
STATES = ("done", "running", "interrupted", "failed", "not started", "outdated")
_NOT_COMPARED = ("output", "runtime")  # a cell's file may differ from the sweep in these keys only


@dataclass
class Cell:
    """One run of a sweep."""

    index: int
    name: str                    # path inside the sweep folder without .h5, e.g. 'fedswe_k100/seed=0'
    variant: str | None          # the variant's label as a file name (None without variants)
    values: dict[str, Any]       # the grid values of this cell (dotted key -> value)
    overrides: dict[str, Any]    # everything applied on top of the base config
    path: str                    # the result file
    sweep: Sweep | None = field(default=None, repr=False)
    _expected: dict | None = field(default=None, repr=False)
    title: str | None = None     # the variant's label as written (for legends and tables)

    @property
    def expected(self) -> dict:
        """Its validated config, flat, without output/runtime (made when first asked for, without
        notices: a listing compares configs, it runs none)."""
        if self._expected is None:
            with log.muted():
                self.check()
        return self._expected

    def check(self) -> None:
        """Validate its config (notices go to the log) and keep it as ``expected``."""
        self._expected = _comparable(self.sweep.config(self).to_dict()) if self.sweep else {}


@dataclass
class Sweep:
    file: str
    base: str
    folder: str
    cells: list[Cell]
    grid_keys: list[str]
    variants: list[str]
    table: dict = field(default_factory=dict)
    plugins: list[str] = field(default_factory=list)  # the sweep file's plug-ins (paths made relative to here)
    labels: dict[str, KeyLabel] = field(default_factory=dict)  # readable names of keys and values
    pack: int = 1  # cells that pack trained together, at most (``--pack`` overrides it)

    def config(self, cell: Cell, world_size: int = 1, threads: int | None = None):
        """The validated Config of ``cell`` (``threads`` fills runtime.threads when the config
        leaves it null)."""
        from .. import config, plugins

        try:
            plugins.load(self.plugins)  # (each once per process) every cell, -j worker and listing reads through here
            label = {"runtime.label": cell.title} if cell.title is not None and "runtime.label" not in cell.overrides \
                else {}
            cfg = config.load(self.base, world_size=world_size, values={**cell.overrides, **label, "output": cell.path})
        except InputError as e:
            if str(e).startswith(self.base):
                raise
            raise InputError(f"{self.file}: cell {cell.index} ({cell.name}): {e}") from None
        if threads is not None and cfg.runtime.threads is None:
            cfg.runtime.threads = threads
        return cfg


# ----------------------------------------------------------------------------- reading a sweep file

def _flat_overrides(data: Any, where: str) -> dict[str, Any]:
    """A mapping of overrides; nested mappings become dotted keys (merged into the base)."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"{where}: must be a mapping of dotted keys to values, got {data!r}")
    out: dict[str, Any] = {}
    for k, v in data.items():
        if not isinstance(k, str) or not k.strip():
            raise InputError(f"{where}: keys must be dotted config keys, got {k!r}")
        if isinstance(v, dict) and v:
            _flat_overrides(v, f"{where}.{k}")  # (its keys checked)
        out.update(dotted(k, v))  # a mapping merges into its section, as --set KEY={...} does
    if "output" in out:
        raise InputError(f"{where}.output: a sweep names each cell's result file itself (use 'out:' for the folder)")
    return out


def load(path: str, out: str | None = None, validate: bool = True) -> Sweep:
    """Read and check a sweep file; every cell's config is validated too (exit 2 naming the cell)
    unless ``validate`` is false (listings that need only the cells' overrides and paths)."""
    data = yamlio.load_file(path, "sweep file")  # 1e-3 is a number; duplicate keys, bombs refused
    if not isinstance(data, dict):
        raise InputError(f"{path}: top level must be a mapping with base, set, variants, grid")
    for k in data:
        if k not in _TOP_KEYS:
            raise InputError(f"{path}: {k}: unknown key (allowed: {', '.join(_TOP_KEYS)})")
    if not isinstance(data.get("base"), str):
        raise InputError(f"{path}: base: the base config file is required (a path relative to the sweep file)")
    base = beside(path, data["base"])
    common = _flat_overrides(data.get("set"), "set")
    grid = _flat_overrides(data.get("grid"), "grid")
    for k, vals in grid.items():
        if not isinstance(vals, list) or not vals:
            raise InputError(f"{path}: grid.{k}: must be a non-empty list of values, got {vals!r}")
    for k, vals in grid.items():
        _refuse_repeated_values(path, k, vals)
    variants = _variants(data.get("variants"), path, grid)
    size = len(variants)
    for vals in grid.values():
        size *= len(vals)
    if size > MAX_CELLS:
        raise InputError(f"{path}: grid: {size} cells (variants x grid values); at most {MAX_CELLS} per sweep file, "
                         f"split it into several")
    folder = data.get("out", os.path.join("runs", _stem(path)))
    if not isinstance(folder, str) or not folder.strip():
        raise InputError(f"{path}: out: must be a folder path, got {folder!r}")
    folder = out if out is not None else beside(path, folder)  # --out: relative to the working directory
    cells = []
    for (label, title, vset), combo in itertools.product(variants, itertools.product(*grid.values())):
        values = dict(zip(grid, combo))
        parts = [p for p in (label if vset is not None else None, assignments(values) if values else None) if p]
        name = "/".join(parts) or "run"
        cells.append(Cell(len(cells), name, label if vset is not None else None, values,
                          {**common, **(vset or {}), **values}, os.path.join(folder, name + ".h5"),
                          title=title if vset is not None else None))
    _refuse_one_name(path, cells, grid)
    table = data.get("table") or {}
    if not isinstance(table, dict):
        raise InputError(f"{path}: table: must be a mapping (see fedmpi table --help)")
    pack = data.get("pack", 1)
    if isinstance(pack, bool) or not isinstance(pack, int) or pack < 1:
        raise InputError(f"{path}: pack: must be a whole number >= 1 (cells trained together), got {pack!r}")
    sweep = Sweep(path, base, folder, cells, list(grid), [v[0] for v in variants if v[2] is not None], table,
                  _plugins(path, data.get("plugins")), _labels(path, data.get("labels"), grid, variants), pack)
    for c in cells:
        c.sweep = sweep
    if validate:  # every cell's config is valid before anything runs; each distinct notice is said once
        with log.once():
            for c in cells:
                c.check()
    return sweep


def beside(sweep_file: str, path: str) -> str:
    """``path`` as written in ``sweep_file``: relative to the sweep file's folder unless absolute."""
    return os.path.normpath(os.path.join(os.path.dirname(sweep_file), os.path.expanduser(path)))


def _plugins(path: str, data: Any) -> list[str]:
    """The ``plugins:`` list: files and folders relative to the sweep file; module names as given."""
    if data is None:
        return []
    if isinstance(data, str):
        data = [data]
    if not isinstance(data, list) or not all(isinstance(p, str) and p.strip() for p in data):
        raise InputError(f"{path}: plugins: must be a list of plug-in files, folders or module names, got {data!r}")
    return [beside(path, p) if p.endswith(".py") or "/" in p or os.path.exists(beside(path, p)) else p
            for p in data]


def _refuse_repeated_values(path: str, key: str, values: list) -> None:
    """Two values of one grid key that a config cannot tell apart (1 and 1.0, true and 1) would
    make two cells of one experiment, which no table could put apart."""
    seen: dict[Any, Any] = {}
    for v in values:
        same = float(v) if isinstance(v, (int, float)) else repr(v)
        if same in seen:
            raise InputError(f"{path}: grid.{key}: {seen[same]!r} and {v!r} are the same value; give each value once")
        seen[same] = v


def _comparable(config_dict: dict) -> dict:
    from .reader import flatten

    return {k: v for k, v in flatten(config_dict).items() if k.split(".", 1)[0] not in _NOT_COMPARED}


def first_difference(cell: Cell, stored_yaml: str) -> str | None:
    """The first key where a finished cell's stored config differs from what the sweep asks now.
    Keys only one side has (a newer or older fedmpi's parameters) are not compared."""
    try:  # text from a file: read with the input limits
        stored = yamlio.loads(stored_yaml, "config") or {}
        stored = _comparable(stored) if isinstance(stored, dict) else {}
    except InputError:
        return "config"
    for k in cell.expected:
        if k in stored and repr(cell.expected[k]) != repr(stored[k]):
            return f"{k}: {stored.get(k)!r} in the file, {cell.expected.get(k)!r} in the sweep"
    return None


def _stem(path: str) -> str:
    name = os.path.basename(path)
    for ext in (".sweep.yaml", ".sweep.yml", ".yaml", ".yml"):
        if name.endswith(ext):
            return name[: -len(ext)]
    return name


def _variants(data: Any, path: str, grid: dict) -> list[tuple[str, str, dict | None]]:
    """(label as a file name, label as written, overrides) per variant; one unnamed ('', '', None)
    when there are none."""
    if data is None:
        return [("", "", None)]
    if not isinstance(data, list) or not data:
        raise InputError(f"{path}: variants: must be a non-empty list of mappings")
    out = []
    for i, v in enumerate(data):
        if not isinstance(v, dict):
            raise InputError(f"{path}: variants[{i}]: must be a mapping of dotted keys (and an optional label)")
        v = dict(v)
        label = v.pop("label", None)
        sets = _flat_overrides(v, f"variants[{i}]")
        both = sorted(set(sets) & set(grid))
        if both:
            raise InputError(f"{path}: variants[{i}].{both[0]}: also a grid key; set it in one place")
        if label is None:
            label = assignments(sets) or f"variant{i}"
        elif not isinstance(label, (str, int)) or not str(label).strip():
            raise InputError(f"{path}: variants[{i}].label: must be a non-empty name, got {label!r}")
        out.append((value_text(str(label)), str(label), sets))
    return out


def _refuse_one_name(path: str, cells: list[Cell], grid: dict) -> None:
    """Two cells with one file name would write one file: two variants whose labels read the same
    as file names, or two values of a grid key that do (``a/b`` and ``a_b``)."""
    combos = math.prod(len(v) for v in grid.values())  # cells per variant (variants are the outer loop)
    seen: dict[str, Cell] = {}
    for c in cells:
        first = seen.setdefault(c.name, c)
        if first is c:
            continue
        if first.index // combos != c.index // combos:
            raise InputError(f"{path}: cells {first.index} and {c.index} get the same file name {c.name!r}; "
                             f"give the variants distinct labels ({first.title!r} and {c.title!r} read the "
                             f"same as file names)")
        key = next(k for k in grid if not same_value(first.values[k], c.values[k]))
        raise InputError(f"{path}: grid.{key}: {first.values[key]!r} and {c.values[key]!r} give one file name "
                         f"({value_text(c.values[key])}); give values that differ as file names")


def _labels(path: str, data: Any, grid: dict, variants: list[tuple[str, str, dict | None]]) -> dict[str, KeyLabel]:
    """The ``labels:`` section: per key (a config key, or ``variant``) a readable name, or a
    mapping with ``name`` and ``values`` (value -> its label). A labelled value of a grid key or
    of the variants must be one of its values (a typo would otherwise label nothing)."""
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"{path}: labels: must be a mapping of keys to a name or {{name, values}}, got {data!r}")
    known = {"variant": [t for _, t, sets in variants if sets is not None], **grid}
    out = {}
    for key, spec in data.items():
        where = f"{path}: labels.{key}"
        if not isinstance(key, str) or not key.strip():
            raise InputError(f"{path}: labels: keys must be config keys or 'variant', got {key!r}")
        if isinstance(spec, str):
            spec = {"name": spec}
        if not isinstance(spec, dict) or set(spec) - {"name", "values"}:
            raise InputError(f"{where}: must be a name or a mapping with name and values, got {spec!r}")
        name, values = spec.get("name"), spec.get("values") or {}
        if name is not None and (not isinstance(name, str) or not name.strip()):
            raise InputError(f"{where}.name: must be a non-empty text, got {name!r}")
        if not isinstance(values, dict):
            raise InputError(f"{where}.values: must be a mapping of values to their labels, got {values!r}")
        for value, text in values.items():
            if not isinstance(text, (str, int, float)) or isinstance(text, bool) or not str(text).strip():
                raise InputError(f"{where}.values: the label of {value!r} must be a non-empty text, got {text!r}")
            if key in known and not any(same_value(value, v) for v in known[key]):
                raise InputError(f"{where}.values: {value!r} is not one of its values "
                                 f"({', '.join(map(repr, known[key]))})")
        texts = [str(t) for t in values.values()]
        if len(set(texts)) < len(texts):
            raise InputError(f"{where}.values: two values have one label; give each its own")
        out[key] = KeyLabel(name, {v: str(t) for v, t in values.items()})
    return out


# ----------------------------------------------------------------------------- cell state

def cell_state(cell: Cell) -> tuple[str, int]:
    """(one of STATES, rounds done in the file). A file left 'running' by a killed run is
    'interrupted': it resumes from its checkpoint (or restarts) when the sweep runs again. A
    completed file whose config is no longer the cell's (the sweep file changed), or whose code
    or data changed since, is 'outdated' (``why_outdated`` says why)."""
    from .hdf5 import is_locked, peek

    status, attrs = peek(cell.path)
    rounds = int(attrs.get("rounds_done", 0) or 0)
    if status in ("missing", "empty"):
        return ("running" if status == "empty" and is_locked(cell.path) else "not started"), 0
    if is_locked(cell.path):
        return "running", rounds
    if status == "completed":
        return ("outdated" if _why(cell, attrs) else "done"), rounds
    if status in ("running", "interrupted"):
        return "interrupted", rounds
    return "failed", rounds


def _why(cell: Cell, attrs: dict) -> str | None:
    try:
        changed = first_difference(cell, str(attrs.get("config", "")))
    except InputError as e:  # e.g. the plug-in that registers its algorithm is not loaded
        return f"the sweep gives the cell a config that is not valid ({e})"
    if changed:
        return f"its config is no longer that of the sweep's cell ({changed})"
    try:
        return provenance.outdated(attrs)
    except (AttributeError, TypeError, ValueError):  # provenance of the wrong shape: a damaged file
        return "its provenance attributes are unreadable"


def why_outdated(cell: Cell) -> str | None:
    """Why a completed cell is outdated (its config, or what code or data changed), or None."""
    from .hdf5 import peek

    status, attrs = peek(cell.path)
    return _why(cell, attrs) if status == "completed" else None


def status_text(sweep: Sweep) -> str:
    """The ``--status`` listing: one line per cell, then the counts."""
    counts = dict.fromkeys(STATES, 0)
    lines = [f"{'#':>4}  {'state':<12} {'rounds':>7}  file"]
    for c in sweep.cells:
        state, rounds = cell_state(c)
        counts[state] += 1
        why = f"  ({why_outdated(c)})" if state == "outdated" else ""
        lines.append(f"{c.index:>4}  {state:<12} {rounds:>7}  {c.path}{why}")
    lines.append(f"{len(sweep.cells)} cells: " + ", ".join(f"{n} {s}" for s, n in counts.items())
                 + f" (result files in {sweep.folder})")
    return "\n".join(lines)
