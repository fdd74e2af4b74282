"""Drives one run: builds the pieces, loops over rounds, evaluates, writes results.

Set-up (data, model, participation, algorithm, result file) is checked collectively: if
any rank fails with bad input, every rank exits 2 and rank 0 prints the first error, so a
wrong file on one node neither hangs the job nor prints one error per rank.
"""

from __future__ import annotations

import faulthandler
import os
import resource
import shutil
import signal
import sys
import threading
import time
import traceback
from typing import Callable

import numpy as np
import psutil
import torch

from .config import Config
from . import checkpoint, guards
from .errors import Diverged, InputError, Interrupted
from .registry import ALGORITHMS
from .runtime import World


def peak_rss_mb() -> float:
    """Largest resident memory of this process so far (MB)."""
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return max(peak_kb / 1024.0, psutil.Process().memory_info().rss / 2**20)


def agree(world: World, fn: Callable[[], object]) -> object:
    """Run ``fn`` on every rank; if it raised InputError anywhere, raise it everywhere."""
    err = None
    try:
        out = fn()
    except InputError as e:
        err, out = e, None
    errors = [e for e in world.allgather_obj(None if err is None else str(err)) if e is not None]
    if errors:
        raise err if err is not None else InputError(errors[0])  # a rank keeps its own error's type
    return out


def _check_memory(cfg: Config, world: World, task, d: int, path: str) -> None:
    """Refuse up front, with the estimate, an O(m d) algorithm state or a local step (batch x
    model) that cannot fit."""
    from .algorithms.base import memory_estimate

    lo, hi = world.shard(task.m)
    need = memory_estimate(cfg.algorithm.name, hi - lo, d)
    free, where = world.free_memory()  # a GPU shared by several ranks: its share
    if need > 0.9 * free:
        raise InputError(f"algorithm.name: {cfg.algorithm.name} keeps {need / 2**30:.1f} GiB of per-client state "
                         f"per rank ({hi - lo} clients x {d} parameters), more than the {free / 2**30:.1f} GiB "
                         f"{where} available; use more ranks or fewer clients")
    batch = int(task.sizes.max()) if cfg.train.full_gradient else cfg.train.batch_size
    step = guards.step_bytes(task, batch, hi - lo, path)
    if need + step > 0.9 * free:
        key = "train.full_gradient" if cfg.train.full_gradient else "train.batch_size"
        raise InputError(f"{key}: a local step of {min(guards.MIN_CHUNK, hi - lo)} clients x {batch} samples needs "
                         f"{step / 2**30:.1f} GiB, more than the {free / 2**30:.1f} GiB {where} available"
                         + (f" besides {need / 2**30:.1f} GiB of per-client state" if need else ""))


def _inject_fault(rank: int, t: int) -> None:
    """Test hook: FEDMPI_TEST_FAULT="RANK:ROUND:raise|kill|usr1" makes that rank fail (or get
    a preemption signal) there."""
    spec = os.environ.get("FEDMPI_TEST_FAULT")
    if not spec:
        return
    r, when, how = spec.split(":")
    if int(r) == rank and int(when) == t:
        if how == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if how == "usr1":
            os.kill(os.getpid(), signal.SIGUSR1)
            return
        raise RuntimeError(f"injected fault at round {t}")


class _StopFlag:
    """SIGTERM, SIGINT and SIGUSR1 set a flag; the ranks agree on it at round boundaries."""

    SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)

    def __init__(self):
        self.signame = ""
        self._old = {}
        for sig in self.SIGNALS:
            try:
                self._old[sig] = signal.signal(sig, self._set)
            except ValueError:  # not the main thread
                pass

    def _set(self, signum, frame) -> None:
        self.signame = signal.Signals(signum).name

    def agreed(self, world: World) -> bool:
        """True on every rank when any rank got a signal (one tiny collective per round)."""
        return world.max_float(1.0 if self.signame else 0.0) > 0 if world.size > 1 else bool(self.signame)

    def restore(self) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


class Runner:
    """One run of ``cfg`` on ``world`` writing ``out_path`` (rank 0)."""

    def __init__(self, cfg: Config, world: World, out_path: str, quiet: bool = False, resume: bool = False,
                 overwrite: bool = False, inputs: tuple[str, ...] = (), label: str = ""):
        self.cfg, self.world, self.out_path, self.quiet, self.label = cfg, world, out_path, quiet, label
        self.writer = None
        self._resumed = None
        self._want_resume = resume
        self.claim = None
        agree(world, lambda: self._claim_output(overwrite, inputs))
        try:
            agree(world, self._setup)
        except BaseException:  # set-up failed (here or on another rank): let go of the file
            if self.writer is not None:
                self.writer.finish("failed")
            elif self.claim is not None:
                self.claim.release(discard=True)
            raise

    def _claim_output(self, overwrite: bool, inputs: tuple[str, ...]) -> None:
        """Rank 0 locks the result file before anything reads or writes it (results/hdf5.py)."""
        if self.world.rank == 0:
            from .results.hdf5 import claim

            self.claim = claim(self.out_path, self.cfg.resume_digest(), inputs, overwrite)
            if overwrite:  # a fresh run: an old checkpoint must not be resumed
                shutil.rmtree(checkpoint.folder_for(self.out_path), ignore_errors=True)

    # ------------------------------------------------------------------ set-up
    def _setup(self) -> None:
        from . import algorithms, participation
        from .data.task import build_task
        from .engine.local import LocalTrainer

        cfg, world = self.cfg, self.world
        task = build_task(cfg, world.device)
        trainer = LocalTrainer(task, cfg.train, cfg.seed)
        part = None
        if ALGORITHMS.get(cfg.algorithm.name).obj.needs_participation:
            part = participation.build(cfg.availability, task.client_info(cfg.seed))
        self.task = task
        self.part = part
        _check_memory(cfg, world, task, trainer.spec.dim, trainer.path)
        self.algo = algorithms.build(algorithms.Context(cfg, world, task, trainer, part))
        folder = checkpoint.folder_for(self.out_path)
        self._resumed = checkpoint.load(world, folder, cfg.resume_digest(), task.m, cfg.rounds)
        self._last_checkpoint = None if self._resumed is None else self._resumed[0]
        if self._resumed is None and self._want_resume:
            raise InputError(f"--resume: no checkpoint at {folder}")
        self.spec = trainer.spec
        self.metric_names = self._metric_names()
        self._train_subset = self._train_eval_subset()
        if world.rank == 0:
            from .results import sidecars
            from .results.hdf5 import ResultWriter

            extra = sidecars.build(cfg.runtime, self.out_path)
            resume_at = self._resumed[0] if self._resumed is not None else None
            self.writer = ResultWriter(self.out_path, cfg.to_yaml(), cfg.seed, world.size, self.metric_names,
                                       task.m, cfg.runtime.log_availability, resume_at=resume_at,
                                       claim_=self.claim, flush_s=cfg.runtime.flush_s)
            self.writer.add_sidecars(extra)
            if resume_at is not None:
                return
            self.writer.write_group("partition", {"samples": task.sizes.astype(np.int64),
                                                  **({"label_hist": task.label_hist} if task.label_hist is not None
                                                     else {})})
            for name, arrays in getattr(self.algo, "static_groups", lambda: {})().items():
                self.writer.write_group(name, arrays)

    def _metric_names(self) -> list[str]:
        names = []
        scalar = self.task.classes == 0 and self.spec.dim == 1
        for label in self.algo.eval_models():
            sfx = f"_{label}" if label else ""
            names += [f"test_loss{sfx}"] + ([f"test_acc{sfx}"] if self.task.classes else [])
            if label == "" and self.task.classes and self.cfg.evaluation.train:
                names += ["train_loss", "train_acc"]
            if scalar:
                names.append(f"x{sfx}")
        names += list(self.algo.metrics) + ["n_active", "wall_time", "peak_rss_mb"]
        return list(dict.fromkeys(names))

    def _train_eval_subset(self) -> torch.Tensor | None:
        k = self.cfg.evaluation.train_samples
        n = self.task.train_x.shape[0]
        if k is None or k >= n:
            return None
        from . import rng

        idx = np.sort(rng.generator(self.cfg.seed, "train_eval").choice(n, size=k, replace=False))
        return torch.as_tensor(idx, device=self.task.train_x.device)

    # ------------------------------------------------------------------ loop
    def run(self) -> int:
        """The round loop. Returns 0, or raises Interrupted after checkpointing on a signal."""
        cfg, world = self.cfg, self.world
        start = self._resume_point()
        t0 = time.perf_counter() - self._wall_offset
        bar = self._progress(start)
        n_active, t = 0, start - 1
        status = "failed"
        stop = _StopFlag()
        try:
            if start == 0:
                row = self._evaluate(0, 0, t0)
                if bar is not None:
                    bar.evaluated(row)
            for t in range(start, cfg.rounds):
                _inject_fault(world.rank, t)
                n_active = self.algo.round(t)
                if self.writer is not None and cfg.runtime.log_availability:
                    self.writer.append_mask(self.algo.last_mask())
                last = t == cfg.rounds - 1 or self.algo.done()
                if (t + 1) % cfg.eval_every == 0 or last:
                    row = self._evaluate(t + 1, n_active, t0)
                    self._stop_if_diverged(row, t + 1)
                    if bar is not None:
                        bar.evaluated(row)
                if bar is not None:
                    bar.update(1)
                if last:
                    break
                every = cfg.runtime.checkpoint_every
                if stop.agreed(world):
                    self._checkpoint(t + 1, t0)
                    status = "interrupted"
                    raise Interrupted(f"signal {stop.signame} at round {t + 1}; checkpoint written, "
                                      f"run the same command again (or with --resume) to continue")
                if every and (t + 1) % every == 0:
                    self._checkpoint(t + 1, t0)
            status = "completed"
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        except Diverged:
            status = "diverged"
            raise
        finally:
            stop.restore()
            if bar is not None:
                bar.close()
            self._finish(status, t + 1 if status in ("completed", "interrupted") else None)
        if self.world.rank == 0 and status == "completed":
            shutil.rmtree(checkpoint.folder_for(self.out_path), ignore_errors=True)
        return 0

    def _state(self, t0: float) -> dict[str, torch.Tensor]:
        state = dict(self.algo.state_dict())
        if self.part is not None:
            state.update({f"participation/{k}": torch.as_tensor(v) for k, v in self.part.state_dict().items()})
        state["runner/wall_time"] = torch.tensor(time.perf_counter() - t0, dtype=torch.float64)
        return state

    def _checkpoint(self, rounds_done: int, t0: float) -> None:
        if self.writer is not None:
            self.writer.flush()  # the file must hold every row up to the checkpoint (e.g. mask rows)
        state = self._state(t0)
        bad = guards.nonfinite(state)  # a diverged state must not replace the last good checkpoint
        self._stop_if_diverged(None, rounds_done, f"state {bad!r} is not finite" if bad else None)
        checkpoint.save(self.world, checkpoint.folder_for(self.out_path), rounds_done, self.cfg.resume_digest(),
                        self.task.m, state)
        self._last_checkpoint = rounds_done

    def _stop_if_diverged(self, row: dict | None, rounds_done: int, finding: str | None = None) -> None:
        """Collective: raise Diverged on every rank when a loss, a model (rank 0, after an
        evaluation) or ``finding`` is not finite."""
        if row is not None and self.world.rank == 0:
            finding = guards.nonfinite_eval(row, self.algo.eval_models())
        guards.stop_if_diverged(self.world, finding, rounds_done, self._last_checkpoint,
                                checkpoint.folder_for(self.out_path))

    def _resume_point(self) -> int:
        """Rounds already done by a committed checkpoint (0 when starting afresh)."""
        self._wall_offset = 0.0
        if self._resumed is None:
            return 0
        rounds_done, state = self._resumed
        dev = self.world.device
        part_state = {k.split("/", 1)[1]: v.numpy() for k, v in state.items() if k.startswith("participation/")}
        if self.part is not None:
            self.part.load_state_dict(part_state)
        self._wall_offset = float(state.pop("runner/wall_time", torch.tensor(0.0)))
        self.algo.load_state_dict({k: v.to(dev) for k, v in state.items()
                                   if not k.startswith(("participation/", "runner/"))})
        return rounds_done

    def _progress(self, start: int):
        from . import progress

        enabled = self.world.rank == 0 and not self.quiet and self.cfg.runtime.progress
        return progress.start(self.cfg.rounds, start, enabled, self.label)

    def _evaluate(self, rounds_done: int, n_active: int, t0: float) -> dict[str, float]:
        """Evaluate on rank 0; extra metrics and peak memory are collective (every rank)."""
        from .engine.evaluate import evaluate

        extra = self.algo.extra_metrics()
        rss = self.world.max_float(peak_rss_mb())
        row: dict[str, float] = {}
        if self.world.rank == 0:
            task, bs = self.task, self.cfg.evaluation.batch_size
            for label, model in self.algo.eval_models().items():
                sfx = f"_{label}" if label else ""
                loss, acc = evaluate(task, self.spec, model, task.test_x, task.test_y, bs)
                row[f"test_loss{sfx}"] = float(loss[0])
                if acc is not None:
                    row[f"test_acc{sfx}"] = float(acc[0])
                if f"x{sfx}" in self.metric_names:
                    row[f"x{sfx}"] = float(model.reshape(-1)[0])
                if label == "" and "train_loss" in self.metric_names:
                    x, y = task.train_x, task.train_y
                    if self._train_subset is not None:
                        x, y = x[self._train_subset], y[self._train_subset]
                    loss, acc = evaluate(task, self.spec, model, x, y, bs)
                    row["train_loss"], row["train_acc"] = float(loss[0]), float(acc[0])
            row.update(extra)
            row.update(round=rounds_done, n_active=n_active, wall_time=time.perf_counter() - t0, peak_rss_mb=rss)
            self.writer.append(row, rounds_done)
        return row

    def _finish(self, status: str, rounds_done: int | None) -> None:
        final = None
        if status == "completed":
            final = self.algo.final_params()
            final = final.detach().float().cpu().numpy()
        if self.writer is not None:
            self.writer.finish(status, final if self.world.rank == 0 else None, rounds_done)


_ABORT_GRACE_S = 5.0  # a failing rank's wait between closing its links and MPI_Abort


def _is_peer_failure(e: Exception) -> bool:
    text = f"{type(e).__name__} {e}"
    return any(w in text for w in ("DistBackendError", "Connection reset", "Connection closed", "timed out",
                                   "Timeout", "Broken pipe", "peer"))


def _say(line: str) -> None:
    """A line on stderr. A launcher that was killed closes our stderr; that must not turn exit 3
    into a BrokenPipeError (the rest of the output goes to /dev/null)."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stderr.fileno())


def run(cfg: Config, world: World, out_path: str, quiet: bool = False, resume: bool = False,
        overwrite: bool = False, inputs: tuple[str, ...] = (), label: str = "") -> int:
    """Run ``cfg``; return the exit code. Errors after set-up are reported with the rank.

    ``overwrite`` lets the run replace a completed or foreign file at ``out_path``; ``inputs``
    are the files it reads (never accepted as the output); ``label`` prefixes progress lines."""
    runner = Runner(cfg, world, out_path, quiet, resume, overwrite, inputs, label)
    try:
        return runner.run()
    except KeyboardInterrupt:
        return 3
    except (Interrupted, Diverged) as e:
        world.barrier()  # rank 0 has marked the file: now every rank may exit (srun --kill-on-bad-exit)
        if world.rank == 0:
            _say(f"fedmpi: {'interrupted' if isinstance(e, Interrupted) else 'diverged'}: {e}")
        return e.exit_code
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
