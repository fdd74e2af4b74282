"""Packed groups: several runs of a sweep in one program, their clients trained together.

``fedmpi sweep --pack N`` (or a sweep file's ``pack: N``) runs up to N cells that *pack* in one
process (or one set of ranks): each round, every run's training phase (``ServerAlgorithm.
begin_round`` -> ``TrainingRequest``) goes into one ``engine.packed.PackedTrainer`` call, and
each run's server step (``finish_round``), evaluation, checkpoint, progress and result file stay
its own. Each run's loop is ``Runner.rounds``, the sequence a run alone follows: this driver
only trains the requests together. Every run gets the bits it gets alone.

Which runs pack (``pack_key``): runs with equal keys train models of one shape on data of one
shape with one local-step rule, in one process world:

- a centralized algorithm that trains by default (``ServerAlgorithm.trains_by_default``: no
  ``local_training`` of its own); decentralized algorithms and overrides run alone;
- ``train.full_gradient`` off (each block's width is its clients' largest sample count);
- the same ``task`` block (dataset, model, clients, partition: a different seed still gives
  other partitions, data and initial models, which the trainer handles per run);
- the same ``train`` keys except the step size (``engine.packed.STEP_SIZE_KEYS``: each client's
  row carries its own run's step size);
- the same process-world keys (``runtime.device``, ``backend``, ``threads``, ``tf32``,
  ``timeout_s``, ``collectives``).

Anything else may differ: seed, algorithm and its parameters, availability, privacy, rounds,
evaluation, checkpoints. After set-up the built trainers are checked too
(``engine.packed.incompatibility``); runs that still differ train in separate blocks.

Failures (docs/SWEEPS.md): a run whose set-up fails with bad input ends with exit 2, a run that
diverges with exit 4 (its last good checkpoint kept); the others go on. A stop signal
checkpoints every run at the same round boundary (exit 3 each). An error in one run's own
step (a plug-in's, a full disk) fails that run alone in a one-process group; with several ranks
it ends the whole group as ``fedmpi run`` ends a job (a rank cannot tell the others), and so
does an error of the shared training step: every run keeps its last checkpoint. A packed run's
``wall_time`` is the group's time, and ``peak_rss_mb`` the group's process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from typing import Callable, Generator, Iterator, Sequence

from .algorithms.capabilities import capabilities
from .algorithms.base import ServerAlgorithm, TrainingRequest
from .config import Config
from .engine.packed import PackedTrainer, SharedData, incompatibility, step_rule
from .errors import Diverged, InputError, Interrupted, WriteFailed, exit_code
from .registry import ALGORITHMS
from .runner import Runner, end_job
from .runtime import World
from .runtime.world import WorldParams


def pack_key(cfg: Config) -> tuple[str | None, str | None]:
    """(key, None) for a config that packs: runs with equal keys may share a group; (None, why)
    for one that must run alone (see the module docstring)."""
    cls = ALGORITHMS.get(cfg.algorithm.name).obj
    name = cfg.algorithm.name
    if not issubclass(cls, ServerAlgorithm):
        return None, f"algorithm {name} is not a centralized (server) algorithm"
    if not capabilities(cls).packs:  # derived: its round is the three phases
        return None, f"algorithm {name} is asynchronous (a server step is not one training phase)"
    if not cls.trains_by_default():
        return None, f"algorithm {name} trains its clients itself (its own local_training)"
    if cfg.train.full_gradient:
        return None, "train.full_gradient is on (blocks as wide as their clients' largest sample count)"
    world = {f.name: getattr(cfg.runtime, f.name) for f in dataclasses.fields(WorldParams)}
    key = {"task": dataclasses.asdict(cfg.task), "train": dataclasses.asdict(step_rule(cfg.train)), "runtime": world}
    return json.dumps(key, sort_keys=True, default=repr), None


def plan(keys: Sequence[tuple[str | None, str | None]], size: int | Callable[[int], int]) -> list[list[int]]:
    """Groups of positions 0..len(keys)-1: positions with equal keys in order, cut into groups of
    ``size`` (or ``size(count of the key)``) at most; a position without a key is a group of its
    own. Groups are ordered by their first position."""
    by_key: dict[str, list[int]] = {}
    groups: list[list[int]] = []
    for i, (key, _) in enumerate(keys):
        if key is None:
            groups.append([i])
        else:
            by_key.setdefault(key, []).append(i)
    for members in by_key.values():
        n = max(1, size(len(members)) if callable(size) else size)
        groups += [members[a:a + n] for a in range(0, len(members), n)]
    return sorted(groups, key=lambda g: g[0])


@dataclass
class Outcome:
    """How one run of a group ended: its exit code (``fedmpi run``'s), and for bad input (2) the
    one-line error; ``busy``: another process writes its result file (it did not run)."""

    code: int
    error: str | None = None
    busy: bool = False


@dataclass
class _Member:
    runner: Runner | None
    label: str
    steps: Generator | None = None  # its loop (``Runner.rounds``); None when it has ended
    outcome: Outcome | None = None  # set when it has ended
    trainer: int = 0                # its position in its PackedTrainer
    request: TrainingRequest | None = None  # what its loop last asked for (None: at a round boundary)

    @property
    def running(self) -> bool:
        return self.outcome is None and self.steps is not None


def run_group(cfgs: Sequence[Config], world: World, outs: Sequence[str], labels: Sequence[str],
              inputs: Sequence[tuple[str, ...]], quiet: bool = False) -> list[Outcome]:
    """Run ``cfgs`` (packable together) as one packed group on ``world`` (collective), into
    ``outs``; each run's ``Outcome``, in order."""
    group = _Group(world)
    try:
        for cfg, out, label, inp in zip(cfgs, outs, labels, inputs):
            group.add(cfg, out, label, inp, quiet)
        group.run()
    except KeyboardInterrupt:
        group.end_all("interrupted", 3)
    except Exception as e:  # an error that every run shares (the training step) or, on several ranks, any
        group.end_all("failed", 1)
        end_job(world, e)  # reported once; ends the whole job on several ranks
    if world.size > 1:
        world.barrier()  # rank 0 has finished every file: now every rank may exit
    ended = [m.outcome or Outcome(1) for m in group.members]
    return ended + [Outcome(1)] * (len(cfgs) - len(ended))  # runs not set up when the group failed


class _Group:
    def __init__(self, world: World):
        self.world = world
        self.members: list[_Member] = []
        self.data = SharedData()

    def add(self, cfg: Config, out: str, label: str, inputs: tuple[str, ...], quiet: bool) -> None:
        """Set up one run (collective); bad input ends that run alone (exit 2), so does a result
        file that cannot be created (1), a stop signal (set-up is interruptible) that run and, as
        the signal stays received, every later one (3)."""
        from .results.hdf5 import OutputBusy

        try:
            runner = Runner(cfg, self.world, out, quiet=quiet, inputs=inputs, label=label)
        except OutputBusy as e:
            self.members.append(_Member(None, label, outcome=Outcome(0, str(e), busy=True)))
            return
        except InputError as e:
            self.members.append(_Member(None, label, outcome=Outcome(2, str(e))))
            return
        except Interrupted as e:  # a stop signal in its set-up (on every rank): the next cells stop at once too
            exit_code(e, self.world.rank)
            self.members.append(_Member(None, label, outcome=Outcome(3)))
            return
        except WriteFailed as e:  # its result file could not be created (disk full): said, nothing left behind
            exit_code(e, self.world.rank)
            self.members.append(_Member(None, label, outcome=Outcome(1)))
            return
        self.data.share(runner.components.task)  # before the next run loads its copy
        self.members.append(_Member(runner, label))

    def run(self) -> None:
        live = [m for m in self.members if m.runner is not None]
        with _progress_lines():
            for m in live:
                m.runner.prepare_loop()
        trainers = self._trainers(live)
        self.data = SharedData()  # the set-up's references: each task holds what it needs
        with contextlib.ExitStack() as stack:
            for m in live:
                stack.enter_context(m.runner.checkpointer)  # stop signals trapped: checkpoint, then exit 3
            for m in live:  # each loop to its first round boundary (first_round)
                m.steps = m.runner.rounds()
                self._step(m, lambda m=m: self._advance(m, None))
            if any(m.outcome is not None and m.outcome.code == 3 for m in live):
                self.end_all("interrupted", 3)  # a signal before the first round: nothing new to save
            while any(m.running for m in live):
                self._round([m for m in live if m.running], trainers)

    def _trainers(self, live: list[_Member]) -> list[tuple[PackedTrainer, list[_Member]]]:
        """One packed trainer per set of compatible runs (one set, unless the built trainers differ
        where the configs did not show it; then said once)."""
        sets: list[list[_Member]] = []
        for m in live:
            mine = m.runner.components.trainer
            home = next((s for s in sets if incompatibility(s[0].runner.components.trainer, mine) is None), None)
            if home is None:
                if sets:
                    why = incompatibility(sets[0][0].runner.components.trainer, mine)
                    _say(f"{m.label} trains apart from {sets[0][0].label}: they differ in {why}")
                sets.append([m])
            else:
                home.append(m)
        out = []
        for s in sets:
            for i, m in enumerate(s):
                m.trainer = i
            out.append((PackedTrainer([m.runner.components.trainer for m in s]), s))
        return out

    def _round(self, live: list[_Member], trainers: list[tuple[PackedTrainer, list[_Member]]]) -> None:
        """One round of every running run: each loop from its round boundary to its training
        request (callbacks, ``begin_round``), the requests trained together, each loop sent its end
        models (``finish_round``, the round's end) on to its next boundary. After a stop signal (a
        run's checkpointer saw it, saved and stopped) every other running run is checkpointed at
        this boundary too, and stops."""
        for m in live:
            self._step(m, lambda m=m: self._advance(m, None))
        for trainer, members in trainers:
            ready = [m for m in members if m.running and m.request is not None]
            if ready:
                ends = trainer.train([(m.trainer, m.request) for m in ready])  # its errors end the group
                for m, end in zip(ready, ends):
                    self._step(m, lambda m=m, end=end: self._advance(m, end))
        if any(m.outcome is not None and m.outcome.code == 3 for m in live):
            for m in live:
                self._step(m, lambda m=m: self._stop(m))

    def _advance(self, m: _Member, end) -> None:
        """Run ``m``'s loop on (sent ``end``, its last request's end models) to what it asks next: a
        training request, or a round boundary; at its end its file is finished now."""
        try:
            m.request = m.steps.send(end)
        except StopIteration:
            m.steps, m.request = None, None
            self._end(m, "completed", 0)

    def _stop(self, m: _Member) -> None:
        """A checkpoint of run ``m`` at this round boundary (unless it has one), then it stops."""
        m.runner.save_here()
        self._end(m, "interrupted", 3)

    def _step(self, m: _Member, fn: Callable[[], None]) -> None:
        """``fn`` for run ``m`` unless it has ended: a divergence, a signal or (in one process) an
        error ends that run alone; on several ranks an error ends the group."""
        if m.outcome is not None:
            return
        try:
            fn()
        except Diverged as e:
            self._end(m, "diverged", exit_code(e, self.world.rank))
        except Interrupted as e:
            self._end(m, "interrupted", exit_code(e, self.world.rank))
        except Exception as e:
            if self.world.size > 1:
                raise
            print(f"fedmpi: {m.label} failed; the other runs of its group go on", file=sys.stderr)
            end_job(self.world, e)
            failed, m.outcome = m.outcome is None, Outcome(1)
            m.runner.status = "failed"
            if failed:  # else it failed while finishing its file: that file stays as it is
                with contextlib.suppress(Exception):
                    m.runner.close_loop()

    def _end(self, m: _Member, status: str, code: int) -> None:
        """Finish run ``m``'s file with ``status``; its outcome is ``code``."""
        m.outcome = Outcome(code)
        m.runner.status = status
        m.runner.close_loop()

    def end_all(self, status: str, code: int) -> None:
        """Every run still open ends with ``status`` (the group stops)."""
        for m in self.members:
            if m.outcome is None and m.runner is not None:
                m.outcome = Outcome(code)
                m.runner.status = status
                with contextlib.suppress(Exception):  # each file is finished, whatever another does
                    m.runner.close_loop()


@contextlib.contextmanager
def _progress_lines() -> Iterator[None]:
    """Progress as lines, also on a terminal: several runs' bars would overwrite each other."""
    before = os.environ.get("FEDMPI_PROGRESS")
    os.environ["FEDMPI_PROGRESS"] = "lines"
    try:
        yield
    finally:
        if before is None:
            del os.environ["FEDMPI_PROGRESS"]
        else:
            os.environ["FEDMPI_PROGRESS"] = before


def _say(text: str) -> None:
    print(f"fedmpi: {text}", file=sys.stderr, flush=True)

