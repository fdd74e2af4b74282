"""Drives one run: set-up on every rank, the round loop, the result file.

Set-up (``build_run``: data, model, participation, algorithm; the evaluator; the
checkpointer, which resumes; the result file) is checked collectively: if any rank fails with
bad input, every rank exits 2 and rank 0 prints the first error, so a wrong file on one node
neither hangs the job nor prints one error per rank. The loop then only sequences the
components: callbacks, ``algorithm.round``, evaluation, checkpoints.
"""

from __future__ import annotations

import faulthandler
import sys
import threading
import time
import traceback
from typing import Callable, Iterable

import numpy as np

from .build import Run, build_run
from .checkpointer import Checkpointer
from .config import Config
from .errors import InputError, Interrupted
from .evaluator import Evaluator
from .registry import CALLBACKS
from .runtime import World

Callback = Callable[[Run, int], None]  # (run, t) before round t, on every rank


def agree(world: World, fn: Callable[[], object]) -> object:
    """Run ``fn`` on every rank; if it raised InputError anywhere, raise it everywhere."""
    err = None
    try:
        out = fn()
    except InputError as e:
        err, out = str(e), None
    errors = [e for e in world.allgather_obj(err) if e is not None]
    if errors:
        raise InputError(errors[0])
    return out


class Runner:
    """One run of ``cfg`` on ``world`` writing ``out_path`` (rank 0). ``callbacks`` run before
    every round on every rank, after those registered by plug-ins (``registry.CALLBACKS``)."""

    def __init__(self, cfg: Config, world: World, out_path: str, quiet: bool = False, resume: bool = False,
                 callbacks: Iterable[Callback] = ()):
        self.cfg, self.world, self.out_path, self.quiet = cfg, world, out_path, quiet
        self.callbacks = [e.obj for e in CALLBACKS] + list(callbacks)
        self.writer = None
        agree(world, lambda: self._setup(resume))

    def _setup(self, resume: bool) -> None:
        self.components = build_run(self.cfg, self.world)
        self.evaluator = Evaluator(self.components)
        self.checkpointer = Checkpointer(self.components, self.out_path, required=resume, flush=self._flush)
        if self.world.rank == 0:
            self.writer = self._open_results()

    def _open_results(self):
        from .results.hdf5 import ResultWriter

        cfg, run = self.cfg, self.components
        resume_at = self.checkpointer.rounds_done or None
        writer = ResultWriter(self.out_path, cfg.to_yaml(), cfg.seed, self.world.size, self.evaluator.names,
                              run.m, cfg.runtime.log_availability, resume_at=resume_at)
        if resume_at is None:
            hist = run.task.label_hist
            writer.write_group("partition", {"samples": run.task.sizes.astype(np.int64),
                                             **({"label_hist": hist} if hist is not None else {})})
            for name, arrays in run.algorithm.static_groups().items():
                writer.write_group(name, arrays)
        return writer

    # ------------------------------------------------------------------ the loop
    def run(self) -> int:
        """The round loop. Returns 0, or raises Interrupted after checkpointing on a signal."""
        algo, rounds = self.components.algorithm, self.cfg.rounds
        start = self.checkpointer.rounds_done
        self._t0 = time.perf_counter() - self.checkpointer.wall_time
        bar = self._progress(start)
        done, status = start, "failed"
        try:
            with self.checkpointer:  # preemption signals: checkpoint at the next round boundary, exit 3
                if start == 0:
                    self._evaluate(0, 0)
                for t in range(start, rounds):
                    for callback in self.callbacks:
                        callback(self.components, t)
                    n_active = algo.round(t)
                    done = t + 1
                    if self.writer is not None and self.cfg.runtime.log_availability:
                        self.writer.append_mask(algo.last_mask())
                    last = done == rounds or algo.done()
                    if done % self.cfg.eval_every == 0 or last:
                        row = self._evaluate(done, n_active)
                        if bar is not None:
                            bar.set_postfix({k: f"{row[k]:.4f}" for k in ("test_acc", "test_loss") if k in row})
                    if bar is not None:
                        bar.update(1)
                    if last:
                        break
                    self.checkpointer.after_round(done, self._wall_time())
            status = "completed"
        except (Interrupted, KeyboardInterrupt):
            status = "interrupted"
            raise
        finally:
            if bar is not None:
                bar.close()
            self._finish(status, done if status != "failed" else None)
        return 0

    def _wall_time(self) -> float:
        return time.perf_counter() - self._t0

    def _evaluate(self, rounds_done: int, n_active: int) -> dict[str, float]:
        row = self.evaluator.evaluate(rounds_done, n_active, self._wall_time())  # collective
        if self.writer is not None:
            self.writer.append(row, rounds_done)
        return row

    def _flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def _progress(self, start: int):
        if self.world.rank != 0 or self.quiet or not self.cfg.runtime.progress or not sys.stderr.isatty():
            return None
        from tqdm import tqdm

        return tqdm(total=self.cfg.rounds, initial=start, unit="round", dynamic_ncols=True, file=sys.stderr)

    def _finish(self, status: str, rounds_done: int | None) -> None:
        final = None
        if status == "completed":
            final = self.components.algorithm.final_params()  # collective
            final = final.detach().float().cpu().numpy()
        if self.writer is not None:
            self.writer.finish(status, final, rounds_done)
        if status == "completed":
            self.checkpointer.discard()


_ABORT_GRACE_S = 5.0  # a failing rank's wait between closing its links and MPI_Abort


def _is_peer_failure(e: Exception) -> bool:
    text = f"{type(e).__name__} {e}"
    return any(w in text for w in ("DistBackendError", "Connection reset", "Connection closed", "timed out",
                                   "Timeout", "Broken pipe", "peer"))


def run(cfg: Config, world: World, out_path: str, quiet: bool = False, resume: bool = False) -> int:
    """Run ``cfg``; return 0 or 1. Errors after set-up are reported with the rank and end the
    whole job; ``Interrupted`` (and KeyboardInterrupt) propagate to the command line."""
    runner = Runner(cfg, world, out_path, quiet, resume)
    try:
        return runner.run()
    except Interrupted:  # exit 3, agreed by every rank: the command line reports it
        raise
    except Exception as e:  # a failure on one rank must end the whole job, reported once
        if _is_peer_failure(e):  # a consequence of another rank's death: that rank reports its own error
            print(f"fedmpi: rank {world.rank}: lost contact with another rank ({type(e).__name__}); "
                  f"ending the job", file=sys.stderr)
        else:
            print(f"fedmpi: rank {world.rank} failed:\n{traceback.format_exc()}", file=sys.stderr)
        if world.comm is not None and world.size > 1:
            if world.rank != 0:
                # Closing our torch.distributed links fails rank 0's pending gloo collective now, so
                # it can mark the result file failed (and abort) before MPI_Abort kills every rank.
                # In a thread, under a watchdog that needs no GIL: a wedged communicator must not
                # keep us from ending the job.
                faulthandler.dump_traceback_later(_ABORT_GRACE_S + 10, exit=True)
                end = time.monotonic() + _ABORT_GRACE_S
                closer = threading.Thread(target=world.close, daemon=True)
                closer.start()
                closer.join(_ABORT_GRACE_S)
                time.sleep(max(0.0, end - time.monotonic()))
            world.comm.Abort(1)
        return 1
