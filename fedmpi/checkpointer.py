"""The checkpointer: the save/resume protocol of a run.

What a checkpoint holds: the algorithm's and the participation model's declared state
(``fedmpi.state``) and the wall time so far; no random-generator state, because every draw is a
function of (seed, purpose, round, client). When: every ``runtime.checkpoint_every`` rounds
(``fedmpi.outputs.CheckpointParams``) and after a stop signal (``fedmpi.signals``: SIGTERM,
SIGINT, SIGHUP, SIGUSR1, trapped from the start of the process), which the ranks agree on at the
next round boundary before raising ``Interrupted`` (exit 3); a signal before the first round of
this start stops with nothing to save. Resume: the same config (its ``resume_digest``) continues
from the last committed checkpoint, on any number of ranks. The storage format (atomic files,
manifest, re-sharding) is ``fedmpi.checkpoint``.
"""

from __future__ import annotations

import shutil
from typing import Callable

import torch

from . import checkpoint, guards, signals
from .build import Components, check_state
from .errors import InputError, Interrupted
from .runtime.launcher import agree_on_error
from .state import State


class Checkpointer:
    """Loads the last checkpoint at construction (collective); ``after_round`` saves when due.

    Use it as a context manager around the round loop: inside, stop signals are trapped
    (``signals.trapped``) instead of killing the process. ``flush`` runs on every rank before
    each save (rank 0 flushes the result file, which must hold every row up to the checkpoint).
    ``fresh``: ignore an existing checkpoint (``--overwrite``; the caller deletes it)."""

    def __init__(self, run: Components, out_path: str, required: bool = False,
                 flush: Callable[[], None] = lambda: None, fresh: bool = False):
        self.run, self.flush = run, flush
        self.folder = checkpoint.folder_for(out_path)
        self.every = run.cfg.runtime.checkpoint_every
        self.rounds_done, self.wall_time = 0, 0.0  # of the resumed checkpoint (0 when fresh)
        self.last_saved: int | None = None  # rounds done at the last committed checkpoint
        loaded = None if fresh else checkpoint.load(run.world, self.folder, run.cfg.resume_digest(), run.m,
                                                    run.cfg.rounds, declared=self._parts(0.0),
                                                    keys=run.cfg.resume_keys(), refusals=run.cfg.resume_refusals)
        if loaded is None and required:
            raise InputError(f"--resume: no checkpoint at {self.folder}")
        if loaded is not None:
            self._restore(*loaded)

    def _restore(self, rounds_done: int, parts: dict[str, State]) -> None:
        self.run.algorithm.load_state_dict(parts.get("algorithm", State()))
        if self.run.participation is not None:
            self.run.participation.load_state_dict(parts.get("participation", State()))
        self.rounds_done = self.last_saved = rounds_done
        self.wall_time = float(parts.get("runner", State()).shared.get("wall_time", torch.tensor(0.0)))

    def save(self, rounds_done: int, wall_time: float) -> None:
        """Write a checkpoint after ``rounds_done`` rounds (every rank calls it); a state that is
        not finite raises ``Diverged`` on every rank instead of replacing the last good one, and state
        it would lose (an attribute a later round made undeclared, ``build.check_state``) InputError."""
        err = None
        try:
            check_state(self.run)  # after set-up and round 1 (the runner), again at every save: round 3's too
        except InputError as e:
            err = e
        agree_on_error(self.run.world.allgather_obj, err)
        self.flush()
        parts = self._parts(wall_time)
        bad = guards.nonfinite({f"{component}/{key}": t for component, state in parts.items()
                                for key, t in state.items()})
        guards.stop_if_diverged(self.run.world, f"state {bad!r} is not finite" if bad else None, rounds_done,
                                self.last_saved, self.folder)
        checkpoint.save(self.run.world, self.folder, rounds_done, self.run.cfg.resume_digest(), self.run.m, parts,
                        keys=self.run.cfg.resume_keys())
        self.last_saved = rounds_done

    def before_rounds(self) -> None:
        """Collective, before the first round of this start: after a signal on any rank, raise
        ``Interrupted`` at once (nothing new to save: the resumed checkpoint, if any, stays)."""
        if self._signalled():
            kept = f"the checkpoint of round {self.last_saved} is kept" if self.last_saved else "no round was run"
            raise Interrupted(f"signal {self._signame()} before round {self.rounds_done + 1}; {kept}, run the same "
                              f"command again to continue")

    def _parts(self, wall_time: float) -> dict[str, State]:
        """What a checkpoint holds: each component's declared state and the wall time."""
        parts = {"algorithm": self.run.algorithm.state_dict(),
                 "runner": State(shared={"wall_time": torch.tensor(wall_time, dtype=torch.float64)})}
        if self.run.participation is not None:
            parts["participation"] = self.run.participation.state_dict()
        return parts

    def after_round(self, rounds_done: int, wall_time: float) -> None:
        """Save when due; after a stop signal on any rank, save and raise ``Interrupted``."""
        if self._signalled():
            self.save(rounds_done, wall_time)
            raise Interrupted(f"signal {self._signame()} at round {rounds_done}; checkpoint "
                              f"written, run the same command again (or with --resume) to continue")
        if self.every and rounds_done % self.every == 0:
            self.save(rounds_done, wall_time)

    def keep_final(self, rounds_done: int, wall_time: float) -> None:
        """Collective, after the last round of a completed run: its final state becomes the one
        checkpoint kept, so that running it again with a larger ``rounds`` continues it (the
        same bits as a run of that many rounds); ``runtime.keep_final: false`` deletes it (rank 0)."""
        if not self.run.cfg.runtime.keep_final:
            if self.run.world.rank == 0:
                shutil.rmtree(self.folder, ignore_errors=True)
            return
        if self.last_saved != rounds_done:
            self.save(rounds_done, wall_time)

    # ------------------------------------------------------------------ stop signals
    def _signalled(self) -> bool:
        """True on every rank when any rank got a signal (one tiny collective per round)."""
        world, got = self.run.world, bool(signals.received())
        return world.max_float(1.0 if got else 0.0) > 0 if world.size > 1 else got

    @staticmethod
    def _signame() -> str:
        return signals.received() or "on another rank"

    def __enter__(self) -> "Checkpointer":
        self._trap = signals.trapped()
        self._trap.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._trap.__exit__(*exc)
