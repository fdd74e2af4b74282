"""Running the cells of a sweep (``sweepfile.Sweep``) with the exit codes of ``fedmpi run``.

Executors: one cell after another in this process (torch is imported once); ``-j N`` worker
processes, each given cells one at a time and ``runtime.threads`` = cores / N unless the
config sets it; ``--index i`` for one cell (under srun, on all its ranks), with the exit code
of ``fedmpi run`` (3 when preempted: the array task requeues and the cell resumes). A completed
cell is skipped, an interrupted one resumes from its checkpoint, a cell another process is
writing is left to it (the result file's lock, results/hdf5.py).

With packing (``--pack N``, a sweep file's ``pack: N``) the unit of work is a group of up to N
cells that pack together (``plan_groups``; ``fedmpi.packed``), run in one process
(``run_group``): the sequential executor runs one group after another, a ``-j`` worker is given
a group at a time, and ``--index i`` is group i.
"""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from typing import TextIO

from . import log, signals
from .cores import available_cores
from .errors import InputError, exit_code
from .results.sweepfile import Cell, Sweep, cell_state

Results = dict[int, tuple[int, "str | None"]]  # cell index -> (exit code, bad input's one line or None)


def index_ranges(indices: list[int]) -> str:
    """Cell indices as ranges: ``0-3, 7, 9-10``."""
    out, run = [], []
    for i in sorted(indices):
        if run and i != run[-1] + 1:
            out.append(run)
            run = []
        run.append(i)
    out += [run] if run else []
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else f"{r[0]}" for r in out)


def say(quiet: bool, text: str) -> None:
    """A progress line of the sweep on stderr (none with ``quiet``)."""
    if not quiet:
        print(f"fedmpi sweep: {text}", file=sys.stderr, flush=True)


def run_cell(sweep: Sweep, cell: Cell, quiet: bool = False, threads: int | None = None,
             world_size: int = 1) -> int:
    """Run one cell in this process (as ``fedmpi run`` would): its exit code; 0 at once when done.
    Raises OutputBusy when another process is writing the cell."""
    from .execute import execute, input_files

    if cell_state(cell)[0] == "done":
        say(quiet, f"cell {cell.index} ({cell.name}) is done: {cell.path}")
        return 0
    cfg = sweep.config(cell, world_size, threads)
    label = f"[{cell.index + 1}/{len(sweep.cells)} {cell.name}]"
    start = time.monotonic()
    try:
        code = execute(cfg, cell.path, quiet=quiet, inputs=(sweep.file, *input_files(cfg, sweep.base)), label=label)
    except InputError:
        if cell_state(cell)[0] == "done":  # another sweep process completed it since the check above
            say(quiet, f"cell {cell.index} ({cell.name}) was completed by another process: {cell.path}")
            return 0
        raise
    how = {0: "completed", 3: "interrupted", 4: "diverged"}.get(code, "failed")
    say(quiet, f"{label} {how} in {time.monotonic() - start:.1f} s: {cell.path}")
    return code


def plan_groups(sweep: Sweep, cells: list[Cell], pack: int, jobs: int = 1, quiet: bool = False) -> list[list[Cell]]:
    """``cells`` as the groups that run together: with ``pack`` > 1, cells whose configs pack
    (``packed.pack_key``) in groups of at most ``pack`` (with ``jobs`` processes, at most
    ceil(cells of the key / jobs), so that every process gets a group), in cell order; every
    other cell alone, each reason said once (unless ``quiet``). ``pack`` 1: every cell alone."""
    if pack <= 1:
        return [[c] for c in cells]
    from .packed import pack_key, plan

    with log.muted():  # the configs' notices are said when a cell runs
        keys = [pack_key(sweep.config(c)) for c in cells]
    apart: dict[str, list[int]] = {}
    for c, (key, why) in zip(cells, keys):
        if key is None:
            apart.setdefault(why, []).append(c.index)
    for why, indices in apart.items():
        say(quiet, f"{'cell' if len(indices) == 1 else 'cells'} {index_ranges(indices)} cannot pack ({why}): "
                   f"each runs alone")
    size = pack if jobs <= 1 else (lambda count: min(pack, -(-count // jobs)))
    return [[cells[i] for i in group] for group in plan(keys, size)]


def run_group(sweep: Sweep, cells: list[Cell], quiet: bool = False, threads: int | None = None,
              world_size: int = 1) -> Results:
    """Run the cells of one group in this process: one cell as ``run_cell`` (bad input and a busy
    cell reported in the results), several packed (``fedmpi.packed``; done cells skipped)."""
    from .results.hdf5 import OutputBusy

    todo = []
    for cell in cells:
        if cell_state(cell)[0] == "done":
            say(quiet, f"cell {cell.index} ({cell.name}) is done: {cell.path}")
        else:
            todo.append(cell)
    if len(todo) <= 1:
        out: Results = {}
        for cell in todo:
            try:
                out[cell.index] = (run_cell(sweep, cell, quiet, threads, world_size), None)
            except OutputBusy:
                say(quiet, f"cell {cell.index} ({cell.name}) is being run by another process; skipped")
                out[cell.index] = (0, None)
            except InputError as e:
                out[cell.index] = (2, str(e))
        return out
    return _run_packed(sweep, todo, quiet, threads, world_size)


def _run_packed(sweep: Sweep, cells: list[Cell], quiet: bool, threads: int | None, world_size: int) -> Results:
    from .execute import execute_group, input_files

    out: Results = {}
    runs: list[tuple[Cell, object]] = []
    for cell in cells:
        try:
            runs.append((cell, sweep.config(cell, world_size, threads)))
        except InputError as e:
            out[cell.index] = (2, str(e))
    if not runs:
        return out
    labels = [f"[{c.index + 1}/{len(sweep.cells)} {c.name}]" for c, _ in runs]
    say(quiet, f"cells {index_ranges([c.index for c, _ in runs])} packed: {len(runs)} runs trained together")
    start = time.monotonic()
    try:
        outcomes = execute_group([cfg for _, cfg in runs], [c.path for c, _ in runs], labels,
                                 [(sweep.file, *input_files(cfg, sweep.base)) for _, cfg in runs], quiet)
    except InputError as e:  # the group's process world (e.g. runtime.device: cuda without a GPU)
        return {**out, **{c.index: (2, str(e)) for c, _ in runs}}
    took = time.monotonic() - start
    for (cell, _), label, o in zip(runs, labels, outcomes):
        if o.busy:
            say(quiet, f"cell {cell.index} ({cell.name}) is being run by another process; skipped")
        elif o.code != 2:
            how = {0: "completed", 3: "interrupted", 4: "diverged"}.get(o.code, "failed")
            say(quiet, f"{label} {how} in {took:.1f} s (packed): {cell.path}")
        out[cell.index] = (o.code, o.error if o.code == 2 else None)
    return out


def group_code(results: Results) -> int:
    """One exit code for a group's results: 3 when any run was interrupted (a SLURM array task
    then requeues), else the code all failed runs share, else 1 when they differ, else 0."""
    codes = {code for code, _ in results.values() if code}
    if 3 in codes:
        return 3
    return codes.pop() if len(codes) == 1 else (1 if codes else 0)


def report_errors(results: Results, rank: int = 0) -> None:
    """Each distinct bad-input line of ``results``, once (``fedmpi: error: ...``)."""
    for error in dict.fromkeys(e for code, e in results.values() if code == 2 and e):
        exit_code(InputError(error), rank)


class _Stop:
    """A signal between cells stops the sweep before the next one (during a cell the run
    itself checkpoints and returns 3); ``forward`` also gets each signal."""

    def __init__(self, forward=None):
        self._trap = signals.trapped(forward)
        self._trap.__enter__()

    @property
    def signame(self) -> str:
        return signals.received()

    def restore(self) -> None:
        self._trap.__exit__(None, None, None)


def run_sequential(sweep: Sweep, groups: list[list[Cell]], quiet: bool, threads: int | None = None) -> int:
    """Run ``groups`` (``plan_groups``) one after another in this process; 3 as soon as one is
    interrupted, else 1 if any failed, else 0; bad input stops the sweep (exit 2, once the
    group it is in has ended). Cells that another process is writing are left to it."""
    worst = 0
    stop = _Stop()
    try:
        for group in groups:
            if stop.signame:
                return 3
            results = run_group(sweep, group, quiet, threads)
            errors = [e for code, e in results.values() if code == 2]
            if errors:
                raise InputError(errors[0])
            if any(code == 3 for code, _ in results.values()):
                return 3
            worst = max([worst] + [1 if code else 0 for code, _ in results.values()])
    finally:
        stop.restore()
    return 3 if stop.signame else worst


def serve(sweep: Sweep, quiet: bool, threads: int | None) -> int:
    """A ``-j`` worker: groups of cell indices arrive on stdin, one group per line; the answer is
    one line to the original stdout, one entry per cell separated by tabs: 'INDEX CODE', or
    'INDEX 2 MESSAGE' for bad input, which the parent prints once however many workers meet it
    (everything else this process prints goes to stderr)."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    with log.muted("fedmpi.config"):  # the parent checked every cell and said the config notices once
        return _serve(sweep, answers, quiet, threads)


def _serve(sweep: Sweep, answers: TextIO, quiet: bool, threads: int | None) -> int:
    for line in sys.stdin:
        group = [sweep.cells[int(i)] for i in line.split()]
        results = run_group(sweep, group, quiet, threads)
        entries = [f"{c.index} 2 {' '.join(results[c.index][1].split())}" if results.get(c.index, (0,))[0] == 2
                   else f"{c.index} {results.get(c.index, (0,))[0]}" for c in group]  # a done cell: 0
        answers.write("\t".join(entries) + "\n")
        if any(code == 3 for code, _ in results.values()):
            break
    return 0


def run_parallel(sweep: Sweep, groups: list[list[Cell]], jobs: int, quiet: bool, out_given: str | None,
                 plugins: list[str] = ()) -> int:
    """``jobs`` worker processes take the groups (``plan_groups``: single cells unpacked) one at a
    time (each imports torch once)."""
    threads = max(1, available_cores() // jobs)
    cmd = [sys.executable, "-m", "fedmpi", "sweep", sweep.file, "--worker", "--threads", str(threads)]
    cmd += (["--out", out_given] if out_given is not None else []) + (["--quiet"] if quiet else [])
    cmd += [a for p in plugins for a in ("--plugin", p)]
    env = dict(os.environ, FEDMPI_PROGRESS="lines")
    todo = [[c.index for c in group] for group in groups]
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
    errors: set[str] = set()
    busy: dict[subprocess.Popen, set[int]] = {}
    try:
        for _ in range(min(jobs, len(todo))):
            p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, env=env)
            procs.append(p)
            sel.register(p.stdout, selectors.EVENT_READ, p)
            busy[p] = set()

        def give(p: subprocess.Popen) -> None:
            if todo and not (stopping or halt):
                try:
                    p.stdin.write(" ".join(map(str, todo[0])) + "\n")
                    p.stdin.flush()
                    busy[p] = set(todo.pop(0))
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
                    for i in busy[p]:  # it died in the middle of its group
                        codes[i] = 3 if rc in (-signal.SIGTERM, -signal.SIGINT, 3) else 1
                    busy[p] = set()
                    continue
                for entry in line.rstrip("\n").split("\t"):  # one line per group (see serve)
                    i, code, *error = entry.split(" ", 2)
                    i, code = int(i), int(code)
                    if error and error[0] not in errors:  # the same bad input in every worker: said once
                        errors.add(error[0])
                        print(f"fedmpi: error: {error[0]}", file=sys.stderr, flush=True)
                    codes[i] = code
                    halt = halt or code in (2, 3)  # interrupted, or bad input that every cell would hit
                busy[p] = set()
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
