"""One run in this process, as ``fedmpi run`` and each cell of ``fedmpi sweep`` make it: the
world set up, the run, the world closed, the exit code; or a packed group of a sweep's cells
(``execute_group``). Every rank of the launched world calls them; they are collective."""

from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .errors import Diverged, Interrupted, WriteFailed, exit_code

if TYPE_CHECKING:
    from .config import Config
    from .packed import Outcome
    from .runtime import World


def input_files(cfg: Config, config_path: str | None) -> tuple[str, ...]:
    """Files a run reads, which its result file must never be: the config and the trace,
    schedule, graph and device files it names."""
    graph = cfg.topology.input_files() if cfg.topology else ()
    return ((config_path,) if config_path else ()) + cfg.availability.input_files() + graph + cfg.clock.input_files()


def execute(cfg: Config, out: str, *, quiet: bool = False, resume: bool = False, overwrite: bool = False,
            inputs: tuple[str, ...] = (), label: str = "") -> int:
    """One run of ``cfg`` into ``out`` in this process (all ranks of the launched world call it):
    the MPI/torch world is set up, the run made, the world closed. Returns the exit code."""
    world = _world(cfg)
    from .runner import run

    finished = False
    try:
        code = run(cfg, world, out, quiet=quiet, resume=resume, overwrite=overwrite, inputs=inputs, label=label)
        finished = code == 0
        return code
    except (Interrupted, Diverged, WriteFailed, KeyboardInterrupt) as e:  # 3, 4 or 1 (also for a sweep's cell)
        return exit_code(e, world.rank)
    finally:
        world.close(finished)


def execute_group(cfgs: Sequence[Config], outs: Sequence[str], labels: Sequence[str],
                  inputs: Sequence[tuple[str, ...]], quiet: bool = False) -> list[Outcome]:
    """The runs of ``cfgs`` into ``outs`` as one packed group in this process (``fedmpi.packed``:
    they must pack together, so they share their process-world keys): each run's outcome."""
    world = _world(cfgs[0])
    from .packed import run_group

    finished = False
    try:
        outcomes = run_group(cfgs, world, outs, labels, inputs, quiet)
        finished = True  # every rank came back from the group: closing is collective
        return outcomes
    finally:
        world.close(finished)


def _world(cfg: Config) -> World:
    from .runtime import World

    return World.create(cfg.runtime.device, cfg.runtime.backend, cfg.runtime.timeout_s, cfg.runtime.threads,
                        cfg.runtime.tf32, cfg.runtime.collectives, cfg.runtime.lost_after_s)
