"""``fedmpi sweep SWEEP.yaml``: run every cell of a sweep file (the file: ``results/sweepfile``; the
executors: ``sweeprun``)."""

from __future__ import annotations

import argparse

from . import log
from .errors import InputError
from .results.paths import assignments
from .results.sweepfile import STATES, cell_state, load, status_text, why_outdated
from .sweeprun import (group_code, plan_groups, report_errors, run_cell, run_group, run_parallel, run_sequential, say,
                       serve)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Run every cell of a sweep file (base config x variants x grid) into its own result "
                          "file. Finished cells are skipped and interrupted ones resumed, so the same command "
                          "continues a sweep.")
    parser.add_argument("sweep", help="sweep file (YAML: base, set, variants, grid, out, table)")
    what = parser.add_mutually_exclusive_group()
    what.add_argument("--index", type=int, metavar="I",
                      help="run only cell I (0-based; a SLURM array task: --index $SLURM_ARRAY_TASK_ID); "
                           "with packing, packed group I")
    what.add_argument("--print-array-size", action="store_true",
                      help="print the number of cells, or with packing of packed groups (sbatch --array=0-<size - 1>), "
                           "and exit")
    what.add_argument("--status", action="store_true",
                      help="list the cells: done, running, interrupted, failed or not started")
    what.add_argument("--list", action="store_true", help="list the cells with their overrides and exit")
    parser.add_argument("-j", "--jobs", type=int, default=1,
                        help="cells run at once, each in its own process with cores/J threads (default 1)")
    parser.add_argument("--pack", type=int, metavar="N",
                        help="train up to N cells that share their shapes in one process, their clients stacked "
                             "together (the same results; default: the sweep file's pack, else 1 = off)")
    parser.add_argument("--out", help="folder of the result files, relative to the working directory (default: the "
                                      "sweep's out:, or runs/<sweep name>, relative to the sweep file)")
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, help=argparse.SUPPRESS)


def run_cli(args: argparse.Namespace) -> int:
    with log.once():  # the notices its cells share (a key of another algorithm): once per sweep
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.jobs < 1:
        raise InputError(f"--jobs: must be >= 1, got {args.jobs}")
    if args.pack is not None and args.pack < 1:
        raise InputError(f"--pack: must be >= 1, got {args.pack}")
    if args.out is not None and not args.out.strip():
        raise InputError("--out: empty folder path")
    from . import plugins

    listing = args.print_array_size or args.list
    if not listing:
        plugins.load(args.plugins)  # every rank, before the cells' configs are checked
    # a whole sweep checks every cell's config before it starts; one cell (--index, a worker's)
    # is checked when it runs, and --status checks only the configs of completed cells
    whole = not (listing or args.status or args.index is not None or args.worker)
    sweep = load(args.sweep, args.out, validate=whole)
    pack = args.pack if args.pack is not None else sweep.pack
    if pack > 1 and listing:  # the groups follow from the cells' configs (and their plug-ins)
        plugins.load(args.plugins)
    if args.print_array_size:
        print(len(plan_groups(sweep, sweep.cells, pack, quiet=True)))
        return 0
    if args.status:
        print(status_text(sweep))
        return 0
    if args.list:
        groups = plan_groups(sweep, sweep.cells, pack, quiet=True)
        where = {c.index: g for g, group in enumerate(groups) for c in group}
        for c in sweep.cells:
            print(f"{c.index:>4}  " + (f"group {where[c.index]:>3}  " if pack > 1 else "")
                  + f"{c.path}  {assignments(c.overrides)}")
        return 0
    from .runtime.launcher import launched_rank, launched_size

    size = launched_size()
    if args.index is not None:
        return _run_index(sweep, args, pack, size, launched_rank())
    if size > 1:
        raise InputError("sweep: run a whole sweep as one process (or -j N); under mpiexec/srun give --index "
                         "to run one cell on all ranks")
    if args.worker:
        return serve(sweep, args.quiet, args.threads)
    for c in sweep.cells:
        if cell_state(c)[0] == "outdated":
            raise InputError(f"{c.path}: holds a completed run that is outdated for cell {c.index} of the sweep "
                             f"({why_outdated(c)}); delete it, or give the sweep another out folder")
    todo = [c for c in sweep.cells if cell_state(c)[0] != "done"]
    say(args.quiet, f"{len(sweep.cells)} cells in {sweep.folder}: {len(sweep.cells) - len(todo)} done, "
                     f"{len(todo)} to run" + (f" with {args.jobs} processes" if args.jobs > 1 and todo else ""))
    groups = plan_groups(sweep, todo, pack, args.jobs, args.quiet)
    packed = [g for g in groups if len(g) > 1]
    if packed:
        say(args.quiet, f"packed: {sum(map(len, packed))} cells in {len(packed)} "
                        f"{'group' if len(packed) == 1 else 'groups'} of up to {pack}")
    if args.jobs > 1 and len(groups) > 1:
        code = run_parallel(sweep, groups, args.jobs, args.quiet, args.out, args.plugins)
    else:
        code = run_sequential(sweep, groups, args.quiet, args.threads)
    states = [cell_state(c)[0] for c in sweep.cells]
    say(args.quiet, ", ".join(f"{states.count(s)} {s}" for s in STATES if states.count(s)))
    return code


def _run_index(sweep, args: argparse.Namespace, pack: int, size: int, rank: int) -> int:
    """``--index I``: cell I, or packed group I (groups of every cell: the same on every machine)."""
    groups = plan_groups(sweep, sweep.cells, pack, quiet=True)
    what = "packed groups" if pack > 1 else "cells"
    if not 0 <= args.index < len(groups):
        raise InputError(f"--index: {args.index} is out of range (the sweep has {len(groups)} {what}, "
                         f"0..{len(groups) - 1})")
    group = groups[args.index]
    if len(group) == 1:  # exactly ``fedmpi run``'s exit code and errors
        return run_cell(sweep, group[0], args.quiet, args.threads, world_size=size)
    results = run_group(sweep, group, args.quiet, args.threads, world_size=size)
    report_errors(results, rank)
    return group_code(results)
