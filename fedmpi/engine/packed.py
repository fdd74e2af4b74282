"""Local training of several runs' clients at once: the trainer of a packed sweep group.

The runs of a group (``fedmpi.packed``) train models of one shape on data of one shape with the
same local-step rule; only the step size may differ (``incompatibility`` says what else must be
equal). Each round every run hands its ``Training`` (its clients, their start models, its round,
step-size factors, step terms, stats to fill). ``PackedTrainer.train`` stacks all their rows
and cuts them into blocks of the size one run uses (``LocalTrainer.chunk_size``; on CUDA every
block has that many rows, as for one run), and runs each block's step loop once
(``LocalTrainer.block_steps``), where one run alone would run a loop for each of its blocks.

Each run's per-round inputs come from its own trainer (``LocalTrainer.step_inputs``: minibatch
ids from its seed and its partition, step counts, dropout keys, augmentation draws; its rows
of a block padded to the block's step count with masked steps), its step sizes from its own
schedule and ``lr_scale``, its step terms apply to its own rows (``PackedStep``). A client's
arithmetic depends only on its own rows (the engine's contract: one intra-op thread on CPU,
one shape per call on CUDA), so every run gets the bits it gets alone.

Data: runs whose training tensors are equal (one dataset, other seeds: only the partitions
differ) share one copy, which replaces each run's own; runs with other data (a dataset drawn
from the seed) are stacked after it, and their minibatch ids shifted to their rows.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch

from .local import BlockLosses, LocalTrainer, StepInputs, Training
from .local_step import LocalStep, StepTerm, TrainConfig
from .params import frozen
from .shapes import pad_rows
from .threads import one_thread

if TYPE_CHECKING:
    from ..task import Task

#: CPU blocks of a packed group hold about this many bytes of client steps (``client_bytes``).
#: Blocks of one run are at most 64 MB (``chunk_size``), but a group fills them: for the anchor
#: task's logreg (190 KB a client), 8 cells' 400 clients trained in blocks of 25-100 rows took
#: 26-30 ms a cell-round and in blocks of 354 (64 MB) 40-48 ms, alternating, on this 2-core
#: machine at load 5 (benchmarks/RESULTS.md). On CUDA the blocks keep one run's size: its
#: kernels, so its bits, depend on it (``engine.shapes``).
CPU_BLOCK_BYTES = 16 << 20

#: train keys that may differ between the runs of a group: each row carries its own step size
STEP_SIZE_KEYS = ("lr", "lr_schedule", "lr_period", "lr_gamma", "lr_warmup")


def step_rule(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` without its step-size keys: what the runs of a group must share."""
    return dataclasses.replace(cfg, **{k: getattr(TrainConfig(), k) for k in STEP_SIZE_KEYS})


def incompatibility(a: LocalTrainer, b: LocalTrainer) -> str | None:
    """Why trainers ``a`` and ``b`` cannot train in one block (None: they can): the same model
    layout, training path, block size, loss, input normalisation, sample shapes and train keys
    except the step size."""
    ta, tb = a.task, b.task
    checks = (
        ("model", a.spec == b.spec and (a.net is None) == (b.net is None)),
        ("task.model (frozen base)", _same_base(ta.model, tb.model)),
        ("train", step_rule(a.cfg) == step_rule(b.cfg)),
        ("train.engine", a.path == b.path and a.fixed_shape == b.fixed_shape),
        ("task.model (loss)", ta.loss is tb.loss),
        ("task.dataset (sample shapes)", ta.train_x.shape[1:] == tb.train_x.shape[1:]
         and ta.train_x.dtype == tb.train_x.dtype and ta.train_y.shape[1:] == tb.train_y.shape[1:]
         and ta.train_y.dtype == tb.train_y.dtype and ta.train_x.device == tb.train_x.device),
        ("task.dataset (normalisation)", ta.image == tb.image and _same(ta.mean, tb.mean) and _same(ta.std, tb.std)),
        ("task.clients (block size)", a.chunk_size() == b.chunk_size()),
        ("runtime.device", a.device == b.device),
    )
    return next((what for what, ok in checks if not ok), None)


def _same_base(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    """Equal frozen bases (``engine.params.frozen``): the block trains every run over the first's."""
    fa, fb = frozen(a), frozen(b)
    return fa.keys() == fb.keys() and all(_same(fa[k].data, fb[k].data) for k in fa)


def _same(x: torch.Tensor | None, y: torch.Tensor | None) -> bool:
    """Equal tensors (None only with None); the same object is equal at once."""
    if x is None or y is None:
        return x is y
    return x is y or (x.shape == y.shape and x.dtype == y.dtype and bool(torch.equal(x, y)))


class SharedData:
    """One copy of each distinct data tensor of several runs' tasks: ``share(task)`` replaces a
    task's training and test tensors, and the tensors of its model's frozen base, by equal ones of
    a task shared before (the same values, so the same bits). A packed group shares each run's
    right after its set-up, so that one dataset in memory serves every run (8 Fashion-MNIST runs:
    55 MB instead of 440), and one base every run over the same base."""

    FIELDS = ("train_x", "train_y", "test_x", "test_y")

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []

    def share(self, task: Task) -> None:
        for name in self.FIELDS:
            setattr(task, name, self._seen(getattr(task, name)))
        for p in frozen(task.model).values():
            p.data = self._seen(p.data)  # the Parameter stays (the stacked nets hold it)

    def _seen(self, mine: torch.Tensor) -> torch.Tensor:
        """An equal tensor shared before, else ``mine`` (shared from now on)."""
        seen = next((t for t in self.tensors if _same(t, mine)), None)
        if seen is None:
            self.tensors.append(mine)
            return mine
        return seen


class PackedStep(LocalStep):
    """The step rule of a block that holds several runs' rows: each run's terms on its rows
    (``segments``: (first row, end row, [(term, its rows as parameter blocks)]) per run)."""

    def __init__(self, cfg: TrainConfig, segments: list[tuple[int, int, list[tuple[StepTerm, dict]]]]):
        super().__init__(cfg, [pair for _, _, terms in segments for pair in terms])
        self.segments = segments

    def add_terms(self, name: str, d: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if not self.terms:
            return d
        pieces = []
        for lo, hi, terms in self.segments:
            piece = d[lo:hi]
            for term, rows in terms:
                piece = term.add(piece, v[lo:hi], rows[name])
            pieces.append(piece)
        return torch.cat(pieces)


class PackedTrainer:
    """Trains the clients of several runs at once (see the module docstring). ``trainers[k]``
    is run k's own trainer; they must be compatible (``incompatibility``: ValueError otherwise)."""

    def __init__(self, trainers: Sequence[LocalTrainer]):
        first = trainers[0]
        for i, other in enumerate(trainers[1:], 1):
            why = incompatibility(first, other)
            if why is not None:
                raise ValueError(f"run {i} cannot train with run 0: they differ in {why}")
        self.trainers = list(trainers)
        self.base = self._share_data()
        task = dataclasses.replace(first.task, train_x=self._x, train_y=self._y)
        self.block = LocalTrainer(task, first.cfg, first.seed, path=first.path, stacked=first.net is not None,
                                  fixed_shape=first.fixed_shape, replay=first._graphs is not None)

    def _share_data(self) -> list[int]:
        """The runs' distinct training sets stacked into ``_x``, ``_y``, and each run's first row
        there; each run's task then holds its rows of them (equal values: one copy in memory)."""
        xs: list[torch.Tensor] = []
        ys: list[torch.Tensor] = []
        which = []
        for tr in self.trainers:
            x, y = tr.task.train_x, tr.task.train_y
            j = next((j for j in range(len(xs)) if _same(xs[j], x) and _same(ys[j], y)), None)
            if j is None:
                j = len(xs)
                xs.append(x)
                ys.append(y)
            which.append(j)
        first = np.cumsum([0] + [x.shape[0] for x in xs])
        self._x = xs[0] if len(xs) == 1 else torch.cat(xs)
        self._y = ys[0] if len(ys) == 1 else torch.cat(ys)
        for tr, j in zip(self.trainers, which):
            rows = slice(int(first[j]), int(first[j + 1]))
            tr.task.train_x, tr.task.train_y = (xs[j], ys[j]) if len(xs) == 1 else (self._x[rows], self._y[rows])
        return [int(first[j]) for j in which]

    def train(self, jobs: Sequence[tuple[int, Training]]) -> list[torch.Tensor]:
        """The end models (n_j, d) of each job (``trainers[k]``'s ``Training``), in order: the bits
        of ``trainers[k].run(work)`` for each."""
        device = self.block.device
        runs = [(k, work, self.trainers[k].steps_of(work.clients, work.t)) for k, work in jobs]
        for _, work, steps in runs:
            if work.stats is not None:
                work.stats.begin(steps)
        sizes = [len(work.clients) for _, work, _ in runs]
        ends = np.cumsum([0] + sizes)
        with one_thread(device):
            x = torch.cat([work.start.detach() for _, work, _ in runs]) if runs else None
        if x is None or x.shape[0] == 0:
            return [work.start.detach().clone() for _, work, _ in runs]
        lr = torch.cat([self.trainers[k].step_sizes(work.t, len(work.clients), work.lr_scale) for k, work, _ in runs])
        steps = np.concatenate([s for _, _, s in runs])
        record = any(work.stats is not None for _, work, _ in runs)
        samples = any(work.stats is not None and work.stats.quantities for _, work, _ in runs)
        self.block.task.model.train()
        chunk, total = self.block_rows(), x.shape[0]
        with one_thread(device):
            for a in range(0, total, chunk):
                k = min(chunk, total - a)
                extra = chunk - k if self.block.fixed_shape else 0  # engine.shapes: pad to one shape
                pieces = [(j, max(a, ends[j]), min(a + k, ends[j + 1])) for j in range(len(runs))
                          if ends[j] < a + k and ends[j + 1] > a and ends[j] < ends[j + 1]]  # none of a clientless run
                xs, rates, todo = (pad_rows(v[a:a + k], extra) for v in (x, lr, steps))
                rule = self._rule(runs, ends, pieces, a, extra)
                inp = self._inputs(runs, ends, pieces, extra, self.block.replays(rule, samples))
                losses = self.block.block_steps(xs, inp, rates, todo, rule, record, samples)
                if extra:
                    x[a:a + k] = xs[:k]
                if losses is not None:
                    self._report(runs, ends, pieces, a, losses)
        return [x[ends[j]:ends[j + 1]] for j in range(len(runs))]

    def block_rows(self) -> int:
        """Rows of a block: one run's on CUDA (its bits depend on it), about ``CPU_BLOCK_BYTES``
        on CPU (where any block gives the same bits)."""
        rows = self.block.chunk_size()
        if self.block.fixed_shape or self.block.device.type == "cuda":
            return rows
        return max(1, min(rows, CPU_BLOCK_BYTES // self.block.client_bytes()))

    def _rule(self, runs: list, ends: np.ndarray, pieces: list, a: int, extra: int) -> LocalStep:
        """The step rule of the block from row a: each piece's run's terms on its rows (the last
        piece's padded like its rows)."""
        segments = []
        for i, (j, lo, hi) in enumerate(pieces):
            pad = extra if i == len(pieces) - 1 else 0
            rows = slice(lo - ends[j], hi - ends[j])
            terms = [(term, self.block.spec.views(pad_rows(term.rows[rows], pad))) for term in runs[j][1].terms]
            segments.append((lo - a, hi - a + pad, terms))
        return PackedStep(self.block.cfg, segments)

    def _inputs(self, runs: list, ends: np.ndarray, pieces: list, extra: int, masks: bool) -> StepInputs:
        """The block's ``StepInputs``: each piece's from its run's trainer (the last piece padded
        like its rows), its minibatch ids shifted to its run's data, all padded to the largest
        step count with masked steps."""
        parts = []
        for i, (j, lo, hi) in enumerate(pieces):
            k, work, steps = runs[j]
            pad = extra if i == len(pieces) - 1 else 0
            rows = slice(lo - ends[j], hi - ends[j])
            clients, todo = pad_rows(work.clients[rows], pad), pad_rows(steps[rows], pad)
            inp = self.trainers[k].step_inputs(clients, work.t, todo, masks=masks)
            if self.base[k]:
                inp.ids = inp.ids + self.base[k]
            parts.append((inp, len(clients)))
        return _stacked(parts)

    @staticmethod
    def _report(runs: list, ends: np.ndarray, pieces: list, a: int, losses: BlockLosses) -> None:
        """Each piece's clients' losses into its run's stats (as ``LocalTrainer.train_``)."""
        for j, lo, hi in pieces:
            stats = runs[j][1].stats
            if stats is not None:
                stats.add(slice(lo - ends[j], hi - ends[j]), losses.cut(slice(lo - a, hi - a)))


def _stacked(parts: list[tuple[StepInputs, int]]) -> StepInputs:
    """One block's ``StepInputs`` from its pieces' (each with its number of rows): every input
    stacked along the clients, each piece padded to the largest step count (ids: its last
    step's again; masks: off; keys and draws: zeros)."""
    if len(parts) == 1:
        return parts[0][0]
    steps = max(inp.steps for inp, _ in parts)
    if any(inp.weights is not None for inp, _ in parts):
        raise ValueError("packed training: full_gradient blocks cannot be stacked")
    masked = any(inp.going is not None or inp.steps < steps for inp, _ in parts)

    def longer(t: torch.Tensor, more: int, fill: str) -> torch.Tensor:
        if not more:
            return t
        tail = t[-1:].expand(more, *t.shape[1:]) if fill == "last" else t.new_zeros((more, *t.shape[1:]))
        return torch.cat([t, tail])

    ids, going, keys, shifts = [], [], [], []
    for inp, n in parts:
        more = steps - inp.steps
        ids.append(longer(inp.ids, more, "last"))
        if masked:
            mine = inp.going if inp.going is not None else torch.ones((inp.steps, n), dtype=torch.bool,
                                                                        device=inp.ids.device)
            going.append(longer(mine, more, "zeros"))
        if inp.keys is not None:
            keys.append(longer(inp.keys, more, "zeros"))
        if inp.shifts is not None:
            shifts.append(longer(inp.shifts, more, "zeros"))
    return StepInputs(steps=steps, ids=torch.cat(ids, 1), going=torch.cat(going, 1) if masked else None,
                      keys=torch.cat(keys, 1) if keys else None, shifts=torch.cat(shifts, 1) if shifts else None)

