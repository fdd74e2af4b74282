"""Drives one run: set-up on every rank, the round loop, the result file.

Set-up (``build_components``: data, model, participation, algorithm; the evaluator; the
checkpointer, which resumes; the result file) is checked collectively: if any rank fails with
bad input, every rank exits 2 and rank 0 prints the first error, so a wrong file on one node
neither hangs the job nor prints one error per rank. The loop then only sequences the
components: callbacks, ``algorithm.round``, evaluation, checkpoints.

Callbacks run on every rank at one of three moments (``WHEN``): ``round_start`` ``fn(run, t)``
before round t, ``round_end`` ``fn(run, t)`` after it, ``evaluated`` ``fn(run, rounds_done,
row)`` after each evaluation with rank 0's metric row (the same row on every rank). An
``evaluated`` callback may return a reason (a string) to stop the run there: rank 0's decision
is agreed by every rank, the run ends ``completed`` after that evaluation and the file records
the reason (attributes ``stopped_early``, ``stopped_round``). ``runtime.stop_at`` is such a
callback; the file's ``callbacks`` attribute lists those that ran.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import shutil
import sys
import threading
import time
import traceback
from typing import TYPE_CHECKING, Callable, Generator, Iterable

import numpy as np

from . import checkpoint, guards, provenance, signals
from .algorithms.capabilities import capabilities
from .algorithms.base import ServerAlgorithm
from .build import Components, build_components, check_state
from .checkpointer import Checkpointer
from .config import Config
from .errors import AGREED, Diverged, InputError, Interrupted, RankLost, WriteFailed
from .evaluator import Evaluator
from .metrics import client_sizes, stop_at
from .registry import CALLBACKS, METRICS
from .runtime import World
from .runtime.folders import check_shared
from .runtime.launcher import agree_on_error, record_exit, restart_count
from .runtime.watch import checkpoint_round, lost_code, lost_notes

if TYPE_CHECKING:
    import torch

    from .algorithms.base import Algorithm, TrainingRequest
    from .results.hdf5 import ResultWriter

Callback = Callable[[Components, int], None]  # (run, t) at round t, on every rank
EvalCallback = Callable[[Components, int, dict], "str | None"]  # (run, rounds_done, row) -> reason to stop
WHEN = ("round_start", "round_end", "evaluated")
SETUP_STOPPED = "during set-up; no round was run, run the same command again to start (or continue)"


def agree(world: World, fn: Callable[[], object], setup: bool = True) -> object:
    """Run ``fn`` on every rank; if it raised InputError or WriteFailed anywhere, or (``setup``) a stop
    signal came during it (``signals.interruptible``), raise on every rank (``agree_on_error``: a rank's own
    error keeps its type, the others name the failing rank). In the round loop (``setup=False``)
    a signal waits for the round boundary, where the run checkpoints."""
    err, out = None, None
    try:
        with signals.interruptible(SETUP_STOPPED) if setup else signals.shielded():
            out = fn()
    except AGREED as e:  # bad input, a stop signal, a result file that could not be created
        err = e
    agree_on_error(world.allgather_obj, err)
    return out


class Runner:
    """One run of ``cfg`` on ``world`` writing ``out_path`` (rank 0).

    ``overwrite`` lets the run replace a completed or foreign file at ``out_path`` and start
    afresh (the old checkpoint is deleted once set-up succeeded on every rank; ignored in a
    requeued SLURM job, which resumes); ``inputs`` are the files it reads (never accepted as
    the output); ``label`` prefixes progress lines; ``callbacks`` (a function: before every
    round; or a ``(when, fn)`` pair, ``when`` in ``WHEN``) run on every rank after those
    registered by plug-ins (``registry.CALLBACKS``)."""

    def __init__(self, cfg: Config, world: World, out_path: str, quiet: bool = False, resume: bool = False,
                 overwrite: bool = False, inputs: tuple[str, ...] = (), label: str = "",
                 callbacks: Iterable[Callback | tuple[str, Callable]] = ()):
        self.cfg, self.world, self.out_path, self.quiet, self.label = cfg, world, out_path, quiet, label
        callbacks = list(callbacks)
        self.callbacks = agree(world, lambda: _by_moment(cfg, callbacks))
        agree(world, lambda: _same_on_every_rank(world, callbacks))
        self.writer = None
        self.claim = None
        if overwrite and restart_count() > 0:  # a requeued SLURM job continues what its first start began
            overwrite = False
            job = os.environ.get("SLURM_JOB_ID", "?")
            logging.getLogger(__name__).info(f"--overwrite ignored: this is restart {restart_count()} of SLURM "
                                             f"job {job}, which resumes")
        try:
            agree(world, lambda: self._claim_output(overwrite, inputs))
            # ranks on several nodes: the output (and checkpoint) folder must be shared (exit 2 if not)
            agree(world, lambda: check_shared(world, os.path.dirname(os.path.abspath(out_path))))
            agree(world, lambda: self._setup(resume, fresh=overwrite))
        except BaseException:  # set-up failed or was stopped (here or on another rank): let go of the file
            if self.writer is not None:
                self.writer.finish("failed")
            elif self.claim is not None:
                self.claim.release(discard=True)
            raise
        if overwrite:  # a fresh run, set up everywhere: only now may the old checkpoint go
            if world.rank == 0:
                shutil.rmtree(checkpoint.folder_for(out_path), ignore_errors=True)
            world.barrier()  # before any rank saves a checkpoint of its own
        if self.writer is not None:  # for the launcher's watch, should this process be killed (runtime.watch)
            world.report(f"file {os.path.abspath(out_path)}\t{os.path.abspath(self.checkpointer.folder)}")

    def _claim_output(self, overwrite: bool, inputs: tuple[str, ...]) -> None:
        """Rank 0 locks the result file before anything reads or writes it (results/hdf5.py)."""
        if self.world.rank == 0:
            from .results.hdf5 import claim

            with signals.deferred():  # a signal meanwhile stops set-up once the claim can be released
                self.claim = claim(self.out_path, self.cfg.resume_digest(), inputs, overwrite, cfg=self.cfg)

    def _setup(self, resume: bool, fresh: bool) -> None:
        """Everything before the round loop (a stop signal ends it at once, ``agree``), except
        rank 0's writing of the result file: a signal then stops the loop before its first round."""
        provenance.reset_inputs()  # what this run reads, not an earlier run of the process
        self.components = build_components(self.cfg, self.world)
        self.evaluator = Evaluator(self.components)
        stop = self.cfg.runtime.stop_at.metric
        if stop is not None and stop not in self.evaluator.names:
            raise InputError(f"runtime.stop_at.metric: this run logs no metric {stop!r} "
                             f"(it logs: {', '.join(self.evaluator.names)})")
        self.checkpointer = Checkpointer(self.components, self.out_path, required=resume, flush=self._flush,
                                         fresh=fresh)
        if self.world.rank == 0:
            with signals.shielded():
                self._open_results()

    def _open_results(self) -> None:
        """Rank 0: the result file (continued after a checkpoint, else new with its static groups)."""
        from .results import sidecars
        from .results.hdf5 import ResultWriter

        cfg, run = self.cfg, self.components
        resume_at = self.checkpointer.rounds_done or None
        notes = {"callbacks": "; ".join(f"{w}: {', '.join(_name(f) for f in fns)}"
                                        for w, fns in self.callbacks.items() if fns),
                 **provenance.record(cfg.to_dict(), skip=(self.out_path,)), **run.privacy.notes()}
        rows_through = None
        if resume_at is not None:
            notes.update(self._continued(resume_at))
            if self.claim.previous == "completed" and resume_at % cfg.eval_every:
                rows_through = resume_at - 1  # its last round's row: a run of more rounds has none there
        elif self.claim.previous == "completed" and not self.claim.overwrite:  # an extension without its final state
            raise InputError(f"{self.out_path}: holds a completed run whose final state was not kept "
                             f"({checkpoint.folder_for(self.out_path)} is missing), so it cannot be extended; "
                             f"use --overwrite to run {cfg.rounds} rounds afresh")
        extra = sidecars.build(cfg.runtime, self.out_path, replace=self.claim.owns_sidecars, config=cfg.to_dict(),
                               continues=resume_at is not None)
        writer = ResultWriter(self.out_path, cfg.to_yaml(), cfg.seed, self.world.size, self.evaluator.names,
                              run.m, cfg.runtime.log_availability, resume_at=resume_at,
                              claim_=self.claim, flush_s=cfg.runtime.flush_s,
                              client_arrays=self.evaluator.client_arrays, notes=notes, rows_through=rows_through,
                              round_series=run.algorithm.round_record(), events=cfg.clock.on)
        self.writer = writer  # set before anything else: a failure below still finishes the file
        writer.add_sidecars(extra)
        writer.notes.update(sidecars.notes(extra))  # the tracker runs, which a resumed run continues
        if resume_at is None:
            hist = run.task.label_hist
            local_test = ({"local_test_samples": client_sizes(run.task).astype(np.int64)}
                          if run.task.local_test_order is not None else {})  # the weights of the clients' test metrics
            writer.write_group("partition", {"samples": run.task.sizes.astype(np.int64), **local_test,
                                             **({"label_hist": hist} if hist is not None else {})})
            for name, arrays in run.algorithm.static_groups().items():
                writer.write_group(name, arrays)

    def _continued(self, rounds_done: int) -> dict[str, str]:
        """Rank 0, before continuing the result file after round ``rounds_done``: refuse what would
        mix two experiments in it -- an input file that changed since the run started
        (``provenance.changed_inputs``; a changed key that a component reads, such as ``rounds``
        under ``privacy.epsilon``, is in the resume digest that ``claim`` compared) -- and return
        the record of what else changed: the root attribute ``config_changes``, a JSON list of
        ``{"round": R, "changed": {key: [old, new]}}``, one entry per start that changed the config
        (the ``config`` attribute is the latest)."""
        from .config import from_stored
        from .results.hdf5 import peek

        attrs = peek(self.out_path)[1]
        changed = provenance.changed_inputs(attrs.get("inputs"), self.cfg.to_dict())
        if changed:
            more = f" (and {len(changed) - 1} more)" if len(changed) > 1 else ""
            raise InputError(f"{changed[0]}{more}: changed since this run started; continuing it after round "
                             f"{rounds_done} would mix two inputs in one result: restore the file, or start afresh "
                             f"with --overwrite")
        old = from_stored(str(attrs.get("config", "")))
        if old is None:
            return {}
        try:
            history = list(json.loads(attrs.get("config_changes") or "[]"))
        except (TypeError, ValueError):
            history = []
        diff = self.cfg.changes_since(old)
        history += [{"round": rounds_done, "changed": diff}] if diff else []
        return {"config_changes": json.dumps(history)} if history else {}

    # ------------------------------------------------------------------ the loop
    def run(self) -> int:
        """The round loop (``rounds``, its training phases by this run's own trainer). Returns 0, or
        raises Interrupted after checkpointing on a signal."""
        self.prepare_loop()
        try:
            with self.checkpointer:  # stop signals: checkpoint at the next round boundary, exit 3
                alone(self.rounds(), self.components.algorithm)
            self.status = "completed"
        except (Interrupted, KeyboardInterrupt):
            self.status = "interrupted"
            raise
        except Diverged:
            self.status = "diverged"
            raise
        except RankLost as e:
            self._note_lost(e)
            raise
        finally:
            self.close_loop()
        return 0

    # The loop is ``prepare_loop``, then inside the checkpointer's block the sequence ``rounds``,
    # then ``close_loop`` with ``status`` set by the driver (failed unless it says otherwise). A
    # driver runs ``rounds`` and trains what it asks for: ``run`` for one run (``alone``),
    # ``fedmpi.packed`` for each run of a packed group, their training phases batched.

    def rounds(self) -> Generator[TrainingRequest | None, torch.Tensor | None, None]:
        """The loop's sequence, the only one (collective, inside the checkpointer's block):
        ``first_round``, then for each round t a boundary, ``round_start(t)``, the round and
        ``round_end``. A generator: it yields None at each round boundary (before round t starts:
        a driver may stop the run there, ``save_here``) and, for an algorithm whose round is the
        three phases (a ``ServerAlgorithm`` that ``packs``), the round's ``TrainingRequest``, to be
        sent the end models (``local_phase``'s, or a packed trainer's: the same bits)."""
        algo = self.components.algorithm
        phased = isinstance(algo, ServerAlgorithm) and capabilities(type(algo)).packs
        t = self.first_round()
        while t is not None:
            yield None  # a round boundary
            self.round_start(t)
            if phased:
                request = algo.begin_round(t)
                n = algo.finish_round(request, (yield request))
            else:
                n = algo.round(t)
            t = self.round_end(t, n)

    def prepare_loop(self) -> None:
        """The clock (``wall_time`` counts from here), the progress reporter, ``status`` failed."""
        self.done = self.checkpointer.rounds_done
        self._t0 = time.perf_counter() - self.checkpointer.wall_time
        self.bar = self._progress(self.done)
        self.status = "failed"

    def first_round(self) -> int | None:
        """Collective, inside the checkpointer's block, before the first round of this start: stop
        on a signal already received, evaluate the initial model of a fresh run; the first round
        to run, or None when none is (done, or stopped early by a callback)."""
        self._start = start = self.checkpointer.rounds_done
        self.checkpointer.before_rounds()
        if start == 0:
            row = self._evaluate(0, 0)
            if self.bar is not None:
                self.bar.evaluated(row)
            if self._stop_early(row, 0):
                return None  # reached before training: no round runs
        return start if start < self.cfg.rounds else None

    def round_start(self, t: int) -> None:
        """Before round t: the ``round_start`` callbacks."""
        for callback in self.callbacks["round_start"]:
            callback(self.components, t)

    def round_end(self, t: int, n_active: int) -> int | None:
        """Collective, after round t (``n_active`` clients trained): callbacks, the availability
        mask, the evaluation when due (divergence, early stop), the checkpoint when due (or after a
        signal: then Interrupted); the next round, or None when the run ends after this one."""
        algo, rounds = self.components.algorithm, self.cfg.rounds
        self.done = done = t + 1
        if t == self._start:  # state the first round made must be declared too (exit 2 on every rank)
            agree(self.world, lambda: check_state(self.components), setup=False)
        events = algo.round_events()  # the clock's record of the round (None without a clock)
        if self.writer is not None:
            self.writer.append_round(algo.round_record())
            if events is not None:
                self.writer.append_events(events)
        for callback in self.callbacks["round_end"]:
            callback(self.components, t)
        if self.writer is not None and self.cfg.runtime.log_availability:
            self.writer.append_mask(algo.last_mask())
        last = done == rounds or algo.done()
        if done % self.cfg.eval_every == 0 or last:
            row = self._evaluate(done, n_active)
            self._stop_if_diverged(row, done)
            if self.bar is not None:
                self.bar.evaluated(row)
            last = self._stop_early(row, done) or last
        if self.bar is not None:
            self.bar.update(1)
        if last:
            return None
        self.checkpointer.after_round(done, self._wall_time())
        return done

    def save_here(self) -> None:
        """At a round boundary: a checkpoint there unless the last one is (a packed group's stop)."""
        if self.checkpointer.last_saved != self.done:
            self.checkpointer.save(self.done, self._wall_time())

    def close_loop(self) -> None:
        """The progress closed, the result file finished with ``status`` (collective when completed)."""
        if self.bar is not None:
            self.bar.close()
        self._finish(self.status, self.done if self.status != "failed" else None)

    def _wall_time(self) -> float:
        return time.perf_counter() - self._t0

    def _evaluate(self, rounds_done: int, n_active: int) -> dict[str, float]:
        row = self.evaluator.evaluate(rounds_done, n_active, self._wall_time())  # collective
        if self.writer is not None:
            self.writer.append(row, rounds_done, self.evaluator.last_clients)
        return row

    def _stop_early(self, row: dict[str, float], rounds_done: int) -> bool:
        """Collective: the ``evaluated`` callbacks on every rank with rank 0's row; True when
        rank 0's callbacks gave a reason to stop (the first is recorded in the file)."""
        if not self.callbacks["evaluated"]:
            return False
        row = self.world.allgather_obj(row if self.world.rank == 0 else None)[0]
        reason = None
        for callback in self.callbacks["evaluated"]:  # all run; the first reason counts
            said = callback(self.components, rounds_done, row)
            reason = reason or said
        reason = self.world.allgather_obj(reason)[0]
        if reason and self.writer is not None:
            self.writer.notes.update(stopped_early=str(reason), stopped_round=rounds_done)
        return bool(reason)

    def _stop_if_diverged(self, row: dict[str, float], rounds_done: int) -> None:
        """Collective: raise Diverged on every rank when a loss or an evaluated model (rank 0) is
        not finite; the last good checkpoint stays (the checkpointer refuses a non-finite state)."""
        finding = guards.nonfinite_eval(row, self.evaluator.last_models) if self.world.rank == 0 else None
        guards.stop_if_diverged(self.world, finding, rounds_done, self.checkpointer.last_saved,
                                self.checkpointer.folder)

    def _flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def _progress(self, start: int):
        from . import progress

        enabled = self.world.rank == 0 and not self.quiet and self.cfg.runtime.progress
        return progress.start(self.cfg.rounds, start, enabled, self.label)

    def _note_lost(self, e: RankLost) -> None:
        """Rank 0: the lost rank goes into the result file (``lost``, ``lost_checkpoint``) and ``e.code``
        says whether the job should requeue (5) or not (1: lost again at the same checkpoint)."""
        if self.writer is not None:
            saved = checkpoint_round(self.checkpointer.folder)
            e.code = lost_code(self.writer.f.attrs.get("lost_checkpoint"), saved)
            self.writer.notes.update(lost_notes(str(e), saved, e.code))

    def _finish(self, status: str, rounds_done: int | None) -> None:
        final = None
        if status == "completed":
            final = self.components.algorithm.final_params()  # collective
            final = final.detach().float().cpu().numpy()
        if status == "completed":  # its final state is kept: a larger rounds extends the run
            try:
                self.checkpointer.keep_final(rounds_done, self._wall_time())  # collective
            except BaseException as e:  # (disk full, a state that is not finite): the file says so
                if self.writer is not None:
                    self.writer.finish("diverged" if isinstance(e, Diverged) else "failed")
                    self.world.report("closed")
                raise
        if self.writer is not None:
            self.writer.finish(status, final, rounds_done)
            self.world.report("closed")


def alone(steps: Generator[TrainingRequest | None, torch.Tensor | None, None], algorithm: Algorithm) -> None:
    """Drive one run's loop ``steps`` (``Runner.rounds``) to its end, each training request by
    ``algorithm.local_phase``."""
    end = None
    while True:
        try:
            request = steps.send(end)
        except StopIteration:
            return
        end = None if request is None else algorithm.local_phase(request)


def _by_moment(cfg: Config, extra: Iterable[Callback | tuple[str, Callable]]) -> dict[str, list[Callable]]:
    """The callbacks of a run by moment: registered ones (option ``when``), ``runtime.stop_at``,
    then ``extra`` (functions run at round start)."""
    out: dict[str, list[Callable]] = {w: [] for w in WHEN}
    pairs = [(e.options.get("when", "round_start"), e.obj) for e in CALLBACKS]
    if cfg.runtime.stop_at.metric is not None:
        pairs.append(("evaluated", stop_at(cfg.runtime.stop_at)))
    pairs += [c if isinstance(c, tuple) else ("round_start", c) for c in extra]
    for when, fn in pairs:
        if when not in out:
            raise InputError(f"plug-in: callback {_name(fn)}: when must be one of {', '.join(WHEN)}, got {when!r}")
        out[when].append(fn)
    return out


def _same_on_every_rank(world: World, extra: Iterable[Callback | tuple[str, Callable]]) -> None:
    """Collective, at set-up: the registered callbacks and metrics, and the run's ``extra``
    callbacks, are the same on every rank, else InputError on every rank. They run on every rank,
    some in collectives (an ``evaluated`` callback's row and reason; per-client metrics), so one
    registered on rank 0 only (under a rank check in a plug-in) would stall the job at its first
    use until ``runtime.timeout_s``."""
    mine = {f"callback {e.name}" for e in CALLBACKS} | {f"metric {name}" for name in METRICS.names()}
    mine |= {f"callback {_name(c[1] if isinstance(c, tuple) else c)}" for c in extra}
    every = world.allgather_obj(sorted(mine))
    for rank, theirs in enumerate(every):
        odd = sorted(set(theirs) ^ set(every[0]))
        if odd:
            where = (0, rank) if odd[0] in every[0] else (rank, 0)
            raise InputError(f"plug-in: {odd[0]} is registered on rank {where[0]} but not on rank {where[1]}; "
                             f"callbacks and metrics run on every rank and must be registered on every rank "
                             f"(not under a rank check)")


def _name(fn: Callable) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


_ABORT_GRACE_S = 5.0  # a failing rank's wait between closing its links and MPI_Abort


_PEER_FAILURE_TYPES = ("DistBackendError", "DistNetworkError", "DistStoreError")  # torch.distributed's
_PEER_FAILURE_WORDS = ("connection reset", "connection closed", "connection refused", "timed out", "timeout",
                       "broken pipe", "peer")


def _is_peer_failure(e: BaseException) -> bool:
    """Whether ``e`` is what another rank's death or stop looks like here: a torch.distributed
    error or an OS connection/timeout error, or a message (gloo's, in any case: 'Timed out')
    that says so."""
    if isinstance(e, (ConnectionError, TimeoutError)) or type(e).__name__ in _PEER_FAILURE_TYPES:
        return True
    text = str(e).lower()
    return any(w in text for w in _PEER_FAILURE_WORDS)


def run(cfg: Config, world: World, out_path: str, quiet: bool = False, resume: bool = False,
        overwrite: bool = False, inputs: tuple[str, ...] = (), label: str = "") -> int:
    """Run ``cfg`` (``Runner`` says what the arguments mean); return 0 or 1. Errors after set-up
    are reported with the rank and end the whole job; ``Interrupted``, ``Diverged`` and
    KeyboardInterrupt propagate to the caller, which maps them to exit codes 3, 4 and 3."""
    runner = Runner(cfg, world, out_path, quiet, resume, overwrite, inputs, label)
    try:
        return runner.run()
    except (Interrupted, Diverged, InputError):  # agreed by every rank: exit 3, 4 or 2, reported by the caller
        world.barrier()  # rank 0 has marked the file: now every rank may exit (srun --kill-on-bad-exit)
        raise
    except Exception as e:  # a failure on one rank must end the whole job, reported once
        return end_job(world, e, runner.writer)


def end_job(world: World, e: Exception, writer: "ResultWriter | None" = None) -> int:
    """After ``e`` on this rank, past set-up: report it once (a peer's death as such, a lost rank
    with what ``writer``'s file kept) and end the whole MPI job, so no rank is left waiting; the
    exit code (5 for a lost rank: resumable, else 1)."""
    code = 1
    if isinstance(e, RankLost):  # rank 0 reports it (the file says it too); exit 5: resumable
        code = e.code if world.rank == 0 else RankLost.code
        if world.rank == 0:
            kept = writer.notes.get("lost", str(e)) if writer is not None else str(e)
            print(f"fedmpi: {kept}", file=sys.stderr)
    elif isinstance(e, WriteFailed):  # disk full: the message says what is kept
        print(f"fedmpi: rank {world.rank}: {e}", file=sys.stderr)
    elif _is_peer_failure(e):  # a consequence of another rank's death: that rank reports its own error
        print(f"fedmpi: rank {world.rank}: lost contact with another rank ({type(e).__name__}); "
              f"ending the job", file=sys.stderr)
    else:
        print(f"fedmpi: rank {world.rank} failed:\n{traceback.format_exc()}", file=sys.stderr)
    if world.comm is not None and world.size > 1:
        if world.rank != 0:
            # Our failure notice (MPI) and closing our torch.distributed links (gloo) end rank 0's
            # pending collective now, so it can mark the result file failed (and abort) before
            # MPI_Abort kills every rank.
            # In a thread, under a watchdog that needs no GIL: a wedged communicator must not
            # keep us from ending the job.
            faulthandler.dump_traceback_later(_ABORT_GRACE_S + 10, exit=True)
            end = time.monotonic() + _ABORT_GRACE_S
            closer = threading.Thread(target=world.abandon, daemon=True)
            closer.start()
            closer.join(_ABORT_GRACE_S)
            time.sleep(max(0.0, end - time.monotonic()))
        else:
            record_exit(code)  # before Abort, which ends this process: launch/fedmpi-launch returns it
            world.leave_watch()  # this end is reported: no loss for the launcher's watch to settle
        world.comm.Abort(code)
    return code
