"""Running the cells of a sweep (``sweepfile.Sweep``) with the exit codes of ``fedmpi run``.

Executors: one cell after another in this process (torch is imported once); ``-j N`` worker
processes, each given cells one at a time and ``runtime.threads`` = cores / N unless the
config sets it; ``--index i`` for one cell (under srun, on all its ranks), with the exit code
of ``fedmpi run`` (3 when preempted: the array task requeues and the cell resumes). A completed
cell is skipped, an interrupted one resumes from its checkpoint, a cell another process is
writing is left to it (the result file's lock, results/hdf5.py).
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
from .errors import InputError
from .results.sweepfile import Cell, Sweep, cell_state


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
                say(quiet, f"cell {cell.index} ({cell.name}) is being run by another process; skipped")
                continue
            if code == 3:
                return 3
            worst = max(worst, 1 if code else 0)
    finally:
        stop.restore()
    return 3 if stop.signame else worst


def serve(sweep: Sweep, quiet: bool, threads: int | None) -> int:
    """A ``-j`` worker: cell indices arrive on stdin, one per line; each answer is written to the
    original stdout as 'INDEX CODE' or 'INDEX 2 MESSAGE' for bad input, which the parent prints
    once however many workers meet it (everything else this process prints goes to stderr)."""
    answers = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    with log.muted("fedmpi.config"):  # the parent checked every cell and said the config notices once
        return _serve(sweep, answers, quiet, threads)


def _serve(sweep: Sweep, answers: TextIO, quiet: bool, threads: int | None) -> int:
    from .results.hdf5 import OutputBusy

    for line in sys.stdin:
        i = int(line)
        try:
            code = run_cell(sweep, sweep.cells[i], quiet, threads)
        except OutputBusy:
            say(quiet, f"cell {i} ({sweep.cells[i].name}) is being run by another process; skipped")
            code = 0
        except InputError as e:
            answers.write(f"{i} 2 {' '.join(str(e).split())}\n")
            continue
        answers.write(f"{i} {code}\n")
        if code == 3:
            break
    return 0


def run_parallel(sweep: Sweep, cells: list[Cell], jobs: int, quiet: bool, out_given: str | None,
                 plugins: list[str] = ()) -> int:
    """``jobs`` worker processes take the cells one at a time (each imports torch once)."""
    threads = max(1, available_cores() // jobs)
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
    errors: set[str] = set()
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
                i, code, *error = line.rstrip("\n").split(" ", 2)
                i, code = int(i), int(code)
                if error and error[0] not in errors:  # the same bad input in every worker: said once
                    errors.add(error[0])
                    print(f"fedmpi: error: {error[0]}", file=sys.stderr, flush=True)
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
