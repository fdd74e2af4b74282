"""``fedmpi sweep SWEEP.yaml``: many runs of one base config, each cell in its own result file.

A sweep file::

    base: fmnist_sine.yaml            # the config every cell starts from (relative to this file)
    out: runs/fmnist_sine             # folder of the cells' result files (default runs/<sweep name>)
    set:                              # overrides for every cell (dotted keys)
      rounds: 200
      runtime.threads: 1
    variants:                         # a list of override sets, each with an optional label
      - {label: fedswe_k100, algorithm.name: fedswe, algorithm.k: 100}
      - {label: fedavg, algorithm.name: fedavg_active, train.lr: 0.05}
    grid:                             # every combination of these values, for every variant
      seed: [0, 1, 2]
    table: {...}                      # what ``fedmpi table SWEEP.yaml`` prints (results/table.py)

Cells are variants x grid, in that order (variant outer); cell ``i`` is the same on every
machine, so ``--index i`` (a SLURM array task) names one cell. A cell's result file is
``OUT/<variant label or its key=value list>/<grid key=value list>.h5``, e.g.
``runs/fmnist_sine/fedswe_k100/seed=0.h5``.

Executors: one cell after another in this process (torch is imported once); ``-j N`` worker
processes, each given cells one at a time and ``runtime.threads`` = cores / N unless the
config sets it; ``--index i`` for one cell (under srun, on all its ranks), with the exit code
of ``fedmpi run`` (3 when preempted: the array task requeues and the cell resumes). A completed
cell is skipped, an interrupted one resumes from its checkpoint, a cell another process is
writing is left to it (the result file's lock, results/hdf5.py).
"""

from __future__ import annotations

import argparse
import itertools
import os
import selectors
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import yaml

from . import log, yamlio
from .errors import InputError
from .results.paths import assignments, value_text

_TOP_KEYS = ("base", "out", "set", "variants", "grid", "table")
STATES = ("done", "running", "interrupted", "failed", "not started", "outdated")
_NOT_COMPARED = ("output", "runtime")  # a cell's file may differ from the sweep in these keys only


@dataclass
class Cell:
    """One run of a sweep."""

    index: int
    name: str                    # path inside the sweep folder without .h5, e.g. 'fedswe_k100/seed=0'
    variant: str | None          # the variant's label (None without variants)
    values: dict[str, Any]       # the grid values of this cell (dotted key -> value)
    overrides: dict[str, Any]    # everything applied on top of the base config
    path: str                    # the result file
    expected: dict = field(default_factory=dict, repr=False)  # its config, flat, without output/runtime


@dataclass
class Sweep:
    file: str
    base: str
    folder: str
    cells: list[Cell]
    grid_keys: list[str]
    variants: list[str]
    table: dict = field(default_factory=dict)

    def config(self, cell: Cell, world_size: int = 1, threads: int | None = None):
        """The validated Config of ``cell`` (``threads`` fills runtime.threads when the config
        leaves it null)."""
        from . import config

        try:
            cfg = config.load(self.base, world_size=world_size, values={**cell.overrides, "output": cell.path})
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
            out.update({f"{k}.{kk}": vv for kk, vv in _flat_overrides(v, f"{where}.{k}").items()})
        else:
            out[k] = v
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
    base = os.path.normpath(os.path.join(os.path.dirname(path), data["base"]))
    common = _flat_overrides(data.get("set"), "set")
    grid = _flat_overrides(data.get("grid"), "grid")
    for k, vals in grid.items():
        if not isinstance(vals, list) or not vals:
            raise InputError(f"{path}: grid.{k}: must be a non-empty list of values, got {vals!r}")
    variants = _variants(data.get("variants"), path, grid)
    folder = out if out is not None else data.get("out") or os.path.join("runs", _stem(path))
    if not isinstance(folder, str) or not folder.strip():
        raise InputError(f"{path}: out: must be a folder path, got {folder!r}")
    cells = []
    for (label, vset), combo in itertools.product(variants, itertools.product(*grid.values())):
        values = dict(zip(grid, combo))
        parts = [p for p in (label if vset is not None else None, assignments(values) if values else None) if p]
        name = "/".join(parts) or "run"
        cells.append(Cell(len(cells), name, label if vset is not None else None, values,
                          {**common, **(vset or {}), **values}, os.path.join(folder, name + ".h5")))
    seen: dict[str, int] = {}
    for c in cells:
        if c.name in seen:
            raise InputError(f"{path}: cells {seen[c.name]} and {c.index} get the same file name {c.name!r}; "
                             f"give the variants distinct labels")
        seen[c.name] = c.index
    table = data.get("table") or {}
    if not isinstance(table, dict):
        raise InputError(f"{path}: table: must be a mapping (see fedmpi table --help)")
    sweep = Sweep(path, base, folder, cells, list(grid), [v[0] for v in variants if v[1] is not None], table)
    if validate:  # every cell's config is valid before anything runs (notices come when a cell runs)
        with log.muted():
            for c in cells:
                c.expected = _comparable(sweep.config(c).to_dict())
    return sweep


def _comparable(config_dict: dict) -> dict:
    from .results.reader import flatten

    return {k: v for k, v in flatten(config_dict).items() if k.split(".", 1)[0] not in _NOT_COMPARED}


def _first_difference(cell: Cell, stored_yaml: str) -> str | None:
    """The first key where a finished cell's stored config differs from what the sweep asks now.
    Keys only one side has (a newer or older fedmpi's parameters) are not compared."""
    try:
        stored = _comparable(yaml.safe_load(stored_yaml) or {})
    except yaml.YAMLError:
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


def _variants(data: Any, path: str, grid: dict) -> list[tuple[str, dict | None]]:
    """(label, overrides) per variant; one unnamed (label '', None) when there are none."""
    if data is None:
        return [("", None)]
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
        out.append((value_text(str(label)), sets))
    return out


# ----------------------------------------------------------------------------- cell state

def cell_state(cell: Cell) -> tuple[str, int]:
    """(one of STATES, rounds done in the file). A file left 'running' by a killed run is
    'interrupted': it resumes from its checkpoint (or restarts) when the sweep runs again. A
    completed file whose config is no longer the cell's (the sweep file changed) is 'outdated'."""
    from .results.hdf5 import is_locked, peek

    status, attrs = peek(cell.path)
    rounds = int(attrs.get("rounds_done", 0) or 0)
    if status in ("missing", "empty"):
        return ("running" if status == "empty" and is_locked(cell.path) else "not started"), 0
    if is_locked(cell.path):
        return "running", rounds
    if status == "completed":
        outdated = cell.expected and _first_difference(cell, str(attrs.get("config", "")))
        return ("outdated" if outdated else "done"), rounds
    if status in ("running", "interrupted"):
        return "interrupted", rounds
    return "failed", rounds


def peek_config(path: str) -> str:
    from .results.hdf5 import peek

    return str(peek(path)[1].get("config", ""))


def status_text(sweep: Sweep) -> str:
    """The ``--status`` listing: one line per cell, then the counts."""
    counts = dict.fromkeys(STATES, 0)
    lines = [f"{'#':>4}  {'state':<12} {'rounds':>7}  file"]
    for c in sweep.cells:
        state, rounds = cell_state(c)
        counts[state] += 1
        lines.append(f"{c.index:>4}  {state:<12} {rounds:>7}  {c.path}")
    lines.append(f"{len(sweep.cells)} cells: " + ", ".join(f"{n} {s}" for s, n in counts.items()))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- running cells

def _say(quiet: bool, text: str) -> None:
    if not quiet:
        print(f"fedmpi sweep: {text}", file=sys.stderr, flush=True)


def run_cell(sweep: Sweep, cell: Cell, quiet: bool = False, threads: int | None = None,
             world_size: int = 1) -> int:
    """Run one cell in this process (as ``fedmpi run`` would): its exit code; 0 at once when done.
    Raises OutputBusy when another process is writing the cell."""
    from .execute import execute, input_files

    if cell_state(cell)[0] == "done":
        _say(quiet, f"cell {cell.index} ({cell.name}) is done: {cell.path}")
        return 0
    cfg = sweep.config(cell, world_size, threads)
    label = f"[{cell.index + 1}/{len(sweep.cells)} {cell.name}]"
    start = time.monotonic()
    code = execute(cfg, cell.path, quiet=quiet, inputs=(sweep.file, *input_files(cfg, sweep.base)), label=label)
    how = {0: "completed", 3: "interrupted", 4: "diverged"}.get(code, "failed")
    _say(quiet, f"{label} {how} in {time.monotonic() - start:.1f} s: {cell.path}")
    return code


class _Stop:
    """A signal between cells stops the sweep before the next one (during a cell the run
    itself checkpoints and returns 3)."""

    def __init__(self, forward=None):
        self.signame = ""
        self._forward = forward
        self._old = {s: signal.signal(s, self._set) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)}

    def _set(self, signum, frame) -> None:
        self.signame = signal.Signals(signum).name
        if self._forward is not None:
            self._forward(signum)

    def restore(self) -> None:
        for s, old in self._old.items():
            signal.signal(s, old)


def run_sequential(sweep: Sweep, cells: list[Cell], quiet: bool, threads: int | None = None) -> int:
    """Run ``cells`` one after another in this process; 3 as soon as one is interrupted, else
    1 if any failed, else 0. Cells that another process is writing are left to it."""
    from .results.hdf5 import OutputBusy

    worst = 0
    stop = _Stop()
    try:
        for cell in cells:
            if stop.signame:
                return 3
            try:
                code = run_cell(sweep, cell, quiet, threads)
            except OutputBusy:
                _say(quiet, f"cell {cell.index} ({cell.name}) is being run by another process; skipped")
                continue
            if code == 3:
                return 3
            worst = max(worst, 1 if code else 0)
    finally:
        stop.restore()
    return 3 if stop.signame else worst


def _serve(sweep: Sweep, quiet: bool, threads: int | None) -> int:
    """A ``-j`` worker: cell indices arrive on stdin, one per line; each answer is written to the
    original stdout as 'INDEX CODE' (everything else this process prints goes to stderr)."""
    from .results.hdf5 import OutputBusy

    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    for line in sys.stdin:
        i = int(line)
        try:
            code = run_cell(sweep, sweep.cells[i], quiet, threads)
        except OutputBusy:
            _say(quiet, f"cell {i} ({sweep.cells[i].name}) is being run by another process; skipped")
            code = 0
        except InputError as e:
            print(f"fedmpi: error: {e}", file=sys.stderr, flush=True)
            code = 2
        answers.write(f"{i} {code}\n")
        if code == 3:
            break
    return 0


def run_parallel(sweep: Sweep, cells: list[Cell], jobs: int, quiet: bool, out_given: str | None,
                 plugins: list[str] = ()) -> int:
    """``jobs`` worker processes take the cells one at a time (each imports torch once)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    threads = max(1, cores // jobs)
    cmd = [sys.executable, "-m", "fedmpi", "sweep", sweep.file, "--worker", "--threads", str(threads)]
    cmd += (["--out", out_given] if out_given is not None else []) + (["--quiet"] if quiet else [])
    cmd += [a for p in plugins for a in ("--plugin", p)]
    env = dict(os.environ, FEDMPI_PROGRESS="lines")
    todo = [c.index for c in cells]
    procs: list[subprocess.Popen] = []
    stopping = halt = False

    def forward(signum: int) -> None:
        nonlocal stopping
        stopping = True
        for p in procs:
            if p.poll() is None:
                p.send_signal(signum)

    stop = _Stop(forward)
    sel = selectors.DefaultSelector()
    codes: dict[int, int] = {}
    busy: dict[subprocess.Popen, int | None] = {}
    try:
        for _ in range(min(jobs, len(todo))):
            p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, env=env)
            procs.append(p)
            sel.register(p.stdout, selectors.EVENT_READ, p)
            busy[p] = None

        def give(p: subprocess.Popen) -> None:
            busy[p] = None
            if todo and not (stopping or halt):
                try:
                    p.stdin.write(f"{todo[0]}\n")
                    p.stdin.flush()
                    busy[p] = todo.pop(0)
                    return
                except BrokenPipeError:  # the worker is gone; its end of the pipe shows up below
                    pass
            try:
                p.stdin.close()
            except BrokenPipeError:
                pass

        for p in procs:
            give(p)
        while sel.get_map():
            for key, _ in sel.select(timeout=1.0):
                p = key.data
                line = p.stdout.readline()
                if not line:  # the worker ended
                    sel.unregister(p.stdout)
                    rc = p.wait()
                    if busy[p] is not None:  # it died in the middle of a cell
                        codes[busy[p]] = 3 if rc in (-signal.SIGTERM, -signal.SIGINT, 3) else 1
                    continue
                i, code = (int(x) for x in line.split())
                codes[i] = code
                halt = halt or code in (2, 3)  # interrupted, or bad input that every cell would hit
                give(p)
    finally:
        stop.restore()
        for p in procs:
            if p.stdin and not p.stdin.closed:
                p.stdin.close()
            p.wait()
    if stopping or 3 in codes.values():
        return 3
    return 2 if 2 in codes.values() else (1 if any(codes.values()) else 0)


# ----------------------------------------------------------------------------- CLI

def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Run every cell of a sweep file (base config x variants x grid) into its own result "
                          "file. Finished cells are skipped and interrupted ones resumed, so the same command "
                          "continues a sweep.")
    parser.add_argument("sweep", help="sweep file (YAML: base, set, variants, grid, out, table)")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--index", type=int, metavar="I",
                      help="run only cell I (0-based; a SLURM array task: --index $SLURM_ARRAY_TASK_ID)")
    what.add_argument("--print-array-size", action="store_true",
                      help="print the number of cells (sbatch --array=0-<size - 1>) and exit")
    what.add_argument("--status", action="store_true",
                      help="list the cells: done, running, interrupted, failed or not started")
    what.add_argument("--list", action="store_true", help="list the cells with their overrides and exit")
    parser.add_argument("-j", "--jobs", type=int, default=1,
                        help="cells run at once, each in its own process with cores/J threads (default 1)")
    parser.add_argument("--out", help="folder of the result files (default: the sweep's out, or runs/<sweep name>)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--plugin", dest="plugins", action="append", default=[], metavar="PATH_OR_MODULE",
                        help="import a plug-in before reading the configs (as fedmpi run --plugin); repeatable")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, help=argparse.SUPPRESS)


def run_cli(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise InputError(f"--jobs: must be >= 1, got {args.jobs}")
    if args.out is not None and not args.out.strip():
        raise InputError("--out: empty folder path")
    from . import plugins

    listing = args.print_array_size or args.list
    if not listing:
        plugins.load(args.plugins)  # every rank, before the cells' configs are checked
    sweep = load(args.sweep, args.out, validate=not listing)
    if args.print_array_size:
        print(len(sweep.cells))
        return 0
    if args.status:
        print(status_text(sweep))
        return 0
    if args.list:
        for c in sweep.cells:
            print(f"{c.index:>4}  {c.path}  {assignments(c.overrides)}")
        return 0
    from .runtime.world import launched_size  # (imports torch: not needed for the listings above)

    size = launched_size()
    if args.index is not None:
        if not 0 <= args.index < len(sweep.cells):
            raise InputError(f"--index: {args.index} is out of range (the sweep has {len(sweep.cells)} cells, "
                             f"0..{len(sweep.cells) - 1})")
        return run_cell(sweep, sweep.cells[args.index], args.quiet, args.threads, world_size=size)
    if size > 1:
        raise InputError("sweep: run a whole sweep as one process (or -j N); under mpiexec/srun give --index "
                         "to run one cell on all ranks")
    if args.worker:
        return _serve(sweep, args.quiet, args.threads)
    for c in sweep.cells:
        if cell_state(c)[0] == "outdated":
            raise InputError(f"{c.path}: holds a completed run of another config than cell {c.index} of the sweep "
                             f"({_first_difference(c, peek_config(c.path))}); delete it, or give the sweep "
                             f"another out folder")
    todo = [c for c in sweep.cells if cell_state(c)[0] != "done"]
    _say(args.quiet, f"{len(sweep.cells)} cells in {sweep.folder}: {len(sweep.cells) - len(todo)} done, "
                     f"{len(todo)} to run" + (f" with {args.jobs} processes" if args.jobs > 1 and todo else ""))
    if args.jobs > 1 and len(todo) > 1:
        code = run_parallel(sweep, todo, args.jobs, args.quiet, args.out, args.plugins)
    else:
        code = run_sequential(sweep, todo, args.quiet, args.threads)
    states = [cell_state(c)[0] for c in sweep.cells]
    _say(args.quiet, ", ".join(f"{states.count(s)} {s}" for s in STATES if states.count(s)))
    return code
