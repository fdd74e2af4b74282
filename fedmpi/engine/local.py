"""Local SGD of many clients at once.

``LocalTrainer.train(start, clients, t)`` runs s local SGD steps (``local_step``: optional
momentum, weight decay and the algorithm's own terms, ``StepTerm``) for every listed
client, starting from the rows of ``start`` (n, d), and returns the end models (n, d). Two
paths compute the same thing:

- batched: the clients' parameters are stacked and every step computes all their gradients
  at once -- through the stacked layers of ``engine.layers`` (one ``baddbmm`` per Linear,
  ordinary autograd; closed-form gradients for single-layer models), or, for a model with
  other modules, one ``vmap(grad(loss))`` call (``torch.func``);
- sequential: the reference loop over clients with ordinary autograd.

A block's per-round inputs (minibatch ids, step masks, dropout keys, augmentation draws) are
made on the host for all its steps at once (``StepInputs``); the step loop (``run_steps``) then
runs device operations only, which ``train.cuda_graphs`` replays as a CUDA graph
(``engine.graphs``).

Minibatch sample ids are drawn on the host from counter-based streams keyed by
(seed, "batch", round, step) and the client's global id (the rows are gathered on the device),
so a client's batches do not depend on which rank trains it or which other clients train with
it. They are drawn uniformly with replacement (``full_gradient`` uses every local sample
instead). Dropout masks come from the same kind of stream, (seed, "dropout", round, step) and
the client id (``models.dropout``). On CPU, training runs with one intra-op thread (``engine.threads``).

Clients may do different numbers of steps (``steps_of``: ``train.local_epochs``, a file,
stragglers' draws): a block runs its largest count and a client that is done gets a zero step size, so its
rows stay exactly where they were (the same bits as training it alone). ``LocalStats`` asks the
trainer for each client's minibatch losses, taken from the gradient pass itself (no extra pass),
and, for the quantities an algorithm declares (``engine.quantities``), its per-sample losses.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Sequence

import numpy as np
import torch
from torch.func import functional_call, grad_and_value, vmap

from .. import rng, saved
from ..data.augment import augment, require_images
from ..models import has_conv
from ..models.dropout import KeyedDropout
from ..models.losses import per_client, per_sample
from .graphs import StepGraphs
from .layers import Deferred, Samples, StackedNet, conv_impl, minibatch_losses, sample_losses
from .local_step import LocalStep, StepTerm, TrainConfig, lr_at  # noqa: F401 (lr_at: re-exported)
from .params import ParamSpec, expanded
from .quantities import ClientQuantity, SampleLosses
from .shapes import MAX_FIXED_BLOCK, fixed_shapes, pad_rows
from .steps import StepCounts
from .threads import one_thread

if TYPE_CHECKING:
    from ..task import Task


@dataclass
class LocalStats:
    """What one ``train`` call reports per trained client, in the order of its rows (filled by the
    trainer; host float64/int64 arrays): ``loss`` the mean of its minibatch losses over the steps it
    took, ``first_loss`` the minibatch loss of its first step (at the start model), ``steps`` the
    number of steps it took; and for each of ``quantities`` (``engine.quantities.ClientQuantity``,
    asked for by the caller) its value in ``extra[name]``."""

    loss: np.ndarray | None = None
    first_loss: np.ndarray | None = None
    steps: np.ndarray | None = None
    quantities: tuple[ClientQuantity, ...] = ()
    extra: dict[str, np.ndarray] = field(default_factory=dict)

    def begin(self, steps: np.ndarray) -> None:
        """Before training clients that take ``steps`` (n,): losses 0 (NaN at the start model)."""
        n = len(steps)
        self.loss, self.first_loss, self.steps = np.zeros(n), np.full(n, np.nan), steps.copy()
        self.extra = {q.name: np.full(n, np.nan) for q in self.quantities}

    def add(self, rows: slice, losses: BlockLosses) -> None:
        """Clients ``rows``'s losses of a block (``BlockLosses`` cut to those clients)."""
        means = losses.means
        self.first_loss[rows], self.loss[rows] = means[0], means.sum(0) / np.maximum(self.steps[rows], 1)
        for q in self.quantities:
            self.extra[q.name][rows] = q.of(losses.samples)


@dataclass(frozen=True)
class ClientMemory:
    """Bytes of one client's local step (``LocalTrainer.memory``), by what they hold."""

    parameters: int  # its trainable parameters (float32)
    gradients: int  # their gradient and the step's update
    optimizer: int  # the momentum buffer (train.momentum > 0), else 0
    minibatch: int  # its samples
    activations: int  # what autograd keeps for the backward pass, and the gradient in flight

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.minibatch + self.activations


@dataclass
class BlockLosses:
    """A block's recorded losses: ``means`` (S, n) the minibatch losses (0 after a client's last
    step), ``samples`` the per-sample losses when asked for (``SampleLosses``), else None."""

    means: np.ndarray
    samples: SampleLosses | None = None

    def cut(self, cols: slice) -> BlockLosses:
        """The clients ``cols`` of the block."""
        return BlockLosses(self.means[:, cols], None if self.samples is None else self.samples.rows(cols))


@dataclass
class Training:
    """One call's worth of local training, as a value: ``LocalTrainer.run(work)`` is
    ``train(start, clients, t, lr_scale, terms=terms, stats=stats)``, and a packed trainer
    (``engine.packed``) trains several runs' at once."""

    start: torch.Tensor                   # (n, d) the models the clients start from
    clients: np.ndarray                   # (n,) their global ids
    t: int                                # the round
    lr_scale: torch.Tensor | None = None  # (n,) factors of each client's step size
    terms: Sequence[StepTerm] = ()        # the algorithm's terms of every step
    stats: LocalStats | None = None       # filled with the clients' losses and steps when given


@dataclass
class StepInputs:
    """What the local steps of one block read that changes from round to round, made on the host
    for all steps at once and placed on the device (``LocalTrainer.step_inputs``). The step loop
    (``LocalTrainer.run_steps``) then runs device operations only, so a CUDA graph can replay it
    with the next round's inputs copied in (``engine.graphs``). Row j is the j-th step drawn."""

    steps: int                           # S: the steps drawn
    ids: torch.Tensor                    # (S, n*b) minibatch rows; full_gradient: (1, n*B), every step
    weights: torch.Tensor | None = None  # (n, B) full_gradient's sample weights, else None
    going: torch.Tensor | None = None    # (S, n) bool: the client still steps (None: all take every step)
    keys: torch.Tensor | None = None     # (S, n) int64 dropout keys (None: no dropout)
    shifts: torch.Tensor | None = None   # (S, n, b, 3) augmentation uniforms (None: no augmentation)

    def tensors(self) -> dict[str, torch.Tensor | None]:
        """{name: tensor or None} of every input but ``steps``, in a fixed order."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "steps"}

    def clone(self) -> "StepInputs":
        return replace(self, **{k: None if v is None else v.clone() for k, v in self.tensors().items()})

    def copy_(self, other: "StepInputs") -> None:
        """Into this one's tensors (same signature)."""
        for mine, theirs in zip(self.tensors().values(), other.tensors().values()):
            if mine is not None:
                mine.copy_(theirs)

    def signature(self) -> tuple:
        """Shapes and dtypes (None for an absent input): equal signatures can share one graph."""
        return (self.steps,) + tuple((k, None if v is None else (tuple(v.shape), v.dtype))
                                     for k, v in self.tensors().items())


def choose_path(engine: str, model: torch.nn.Module, device: torch.device) -> str:
    """``auto``: batched, except a model without stacked layers that has convolutions, on CPU,
    where vmapped convolutions lose to the loop (benchmarks/engine.py, benchmarks/RESULTS.md)."""
    if engine != "auto":
        return engine
    if StackedNet.compile(model) is None and device.type == "cpu" and has_conv(model):
        return "sequential"
    return "batched"


class LocalTrainer:
    """Local training of a rank's clients on ``task``; see the module docstring."""

    def __init__(self, task: Task, cfg: TrainConfig, seed: int, path: str | None = None, conv: str | None = None,
                 stacked: bool = True, fixed_shape: bool | None = None, replay: bool | None = None):
        """``path`` forces batched or sequential (default: ``choose_path``); ``conv`` picks the
        stacked convolution (default: ``layers.conv_impl``); ``stacked=False`` makes the batched
        path use vmap(grad) (the reference the stacked layers replace, for benchmarks);
        ``fixed_shape`` pads every batched block to ``chunk_size`` rows (default: on CUDA, see
        ``engine.shapes``; tests force it on CPU, where it must not change a bit); ``replay``
        runs the step loop through ``engine.graphs`` (default: ``train.cuda_graphs`` on CUDA; on
        CPU, for tests, an eager replay through the same buffers)."""
        self.task = task
        self.cfg = cfg
        self.seed = seed
        self.spec = ParamSpec.of(task.model)
        self.device = task.train_x.device
        self.path = path or choose_path(cfg.engine, task.model, self.device)
        self.fixed_shape = (fixed_shapes(self.device) if fixed_shape is None else fixed_shape) \
            and self.path == "batched"
        require_images(list(cfg.augment), task.image, tuple(task.train_x.shape[1:]))
        self.net = StackedNet.compile(task.model, conv or conv_impl(self.device)) if stacked else None  # None: vmap
        self._sizes = np.asarray(task.sizes, dtype=np.int64)  # host copies for the minibatch ids
        self._one_sample = bool((self._sizes == 1).all())  # e.g. the quadratic task
        self._offsets = np.asarray(task.offsets[:-1], dtype=np.int64)
        self._order = task.order.cpu().numpy()
        # each client's one sample (None: client i's sample is row i, as in the quadratic task)
        self._only = self._order[self._offsets] if self._one_sample else None
        if self._only is not None and np.array_equal(self._only, np.arange(len(self._only))):
            self._only = None
        self._step_counts = StepCounts(cfg, task.sizes, seed)
        self._input_dtype = task.inputs(task.train_x[:1]).dtype  # float32, or int64 token ids
        self._reads_inputs = self.net is None or self.net.reads_inputs
        if replay is None:
            replay = cfg.cuda_graphs and self.device.type == "cuda" and self.fixed_shape
        graphable = self.path == "batched" and self.net is not None  # the stacked layers: device ops only
        self._graphs = StepGraphs(self._replayed_steps, self.device) if replay and graphable else None
        model = task.model
        self._key_names = [f"{name}.key" for name, mod in model.named_modules() if isinstance(mod, KeyedDropout)]
        each_sample = per_sample(task.loss)

        def loss_of(params: dict, keys: dict, xb: torch.Tensor, yb: torch.Tensor,
                    wb: torch.Tensor | None) -> torch.Tensor:
            out = functional_call(model, {**params, **keys}, (task.inputs(xb),))
            if wb is None:
                return task.loss(out, yb)
            return (each_sample(out.unsqueeze(0), yb.unsqueeze(0))[0] * wb).sum()

        self._loss_of = loss_of
        self._grad = grad_and_value(loss_of)  # (gradients, loss): the loss comes free
        self._batched_grad = vmap(self._grad, in_dims=(0, 0, 0, 0, 0), randomness="different")
        self._batched_grad_nw = vmap(lambda p, k, x, y: self._grad(p, k, x, y, None), randomness="different")

    # ------------------------------------------------------------------ data
    def batch(self, clients: np.ndarray, t: int, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Inputs (n, b, ...), targets (n, b, ...) and sample weights (n, b) or None of step ``step``
        of round t (the minibatch the step loop draws there). For a model of the inputs' shape only
        (``StackedNet.reads_inputs``) the inputs are a read-only broadcast view of one stored row."""
        return self._minibatch(self.step_inputs(clients, t, step + 1, first=step), 0, len(clients))

    def step_inputs(self, clients: np.ndarray, t: int, steps: int | np.ndarray, first: int = 0,
                    masks: bool = False) -> StepInputs:
        """``StepInputs`` of steps first..S-1 of round t, S = max(steps) (``steps``: one count or one
        per client); ``masks``: ``going`` even when every client takes every step (a graph's
        buffers must not depend on the round)."""
        counts = np.broadcast_to(np.asarray(steps, dtype=np.int64), (len(clients),))
        last = int(counts.max()) if len(clients) else first
        if self.cfg.full_gradient:
            sizes = self._sizes[clients]
            j = np.arange(int(sizes.max()))
            local = np.minimum(j[None, :], sizes[:, None] - 1)
            w = (j[None, :] < sizes[:, None]).astype(np.float32) / sizes[:, None].astype(np.float32)
            inp = StepInputs(steps=last - first, weights=torch.as_tensor(w, device=self.device),
                             ids=torch.as_tensor(self._order[self._offsets[clients][:, None] + local].reshape(1, -1),
                                                 device=self.device))
        else:
            inp = StepInputs(steps=last - first, ids=self.sample_ids(clients, t, last, first))
        if masks or (counts != last).any():
            inp.going = torch.as_tensor(np.arange(first, last)[:, None] < counts[None, :], device=self.device)
        if self._key_names:
            inp.keys = torch.as_tensor(np.stack([self._dropout_bits(clients, t, step) for step in range(first, last)]),
                                       device=self.device)
        if self.cfg.augment and self.task.image:
            b = inp.ids.shape[1] // max(len(clients), 1)  # minibatch width (full_gradient: the largest client)
            counters = (clients.astype(np.int64)[:, None, None] * b + np.arange(b)[None, :, None]) * 3 + np.arange(3)
            inp.shifts = torch.empty((last - first, *counters.shape), dtype=torch.float32, device=self.device)
            for row, step in enumerate(range(first, last)):  # float64 draws of one step at a time
                inp.shifts[row] = torch.as_tensor(rng.uniform(rng.key(self.seed, "augment", t, step), counters),
                                                dtype=torch.float32)
        return inp

    def _minibatch(self, inp: StepInputs, j: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(inputs, targets, weights) of the j-th step of ``inp``, for its n clients (device ops only)."""
        ids = inp.ids[0 if inp.weights is not None else j]
        sample = self.task.train_x.shape[1:]
        if self._reads_inputs:
            xb = self.task.train_x.index_select(0, ids).view(n, -1, *sample)
        else:  # a model of the inputs' shape only: any rows will do (10^6 quadratic clients: 5% of a round)
            xb = self.task.train_x[:1].expand(n, len(ids) // n, *sample)
        yb = self.task.train_y.index_select(0, ids).view(n, -1, *self.task.train_y.shape[1:])
        if inp.shifts is not None:
            # augmentation works on [0, 255] floats; Task.inputs normalises afterwards
            xb = augment(xb.float(), list(self.cfg.augment), self.cfg.augment_mode, inp.shifts[j])
        return xb, yb, inp.weights

    def sample_ids(self, clients: np.ndarray, t: int, steps: int, first: int = 0) -> torch.Tensor:
        """Row ids (steps - first, n * b) of the minibatches of steps first..steps-1 of round t, drawn at once
        (one numpy pass and one copy to the device instead of one per step; the same numbers):
        step s of client c takes sample floor(u * n_c) of its own, u from stream (seed, "batch",
        t, s) at counters c * b .. c * b + b - 1. Computed on the host (a few thousand integers:
        numpy is many times cheaper than a chain of small device ops); only the data rows are
        gathered on the device."""
        b = self.cfg.batch_size
        if self._one_sample:  # every client holds one sample: every draw is that sample (no hashing)
            rows = clients if self._only is None else self._only[clients]
            rows = np.repeat(rows, b) if b > 1 else rows
            return torch.as_tensor(np.tile(rows, (steps - first, 1)) if steps - first > 1 else rows[None],
                                   device=self.device)
        sizes = self._sizes[clients][None, :, None]
        counters = clients.astype(np.int64)[:, None] * b + np.arange(b)[None, :]
        keys = np.array([rng.key(self.seed, "batch", t, step) for step in range(first, steps)], dtype=np.uint64)
        u = rng.uniform(keys[:, None, None], np.broadcast_to(counters, (len(keys), *counters.shape)))
        local = np.minimum((u * sizes).astype(np.int64), sizes - 1)
        rows = self._order[self._offsets[clients][None, :, None] + local]
        return torch.as_tensor(rows.reshape(len(keys), -1), device=self.device)

    # ------------------------------------------------------------------ training
    def steps_of(self, clients: np.ndarray, t: int) -> np.ndarray:
        """Local steps (n,) of ``clients`` in round t (``engine.steps.StepCounts.of``)."""
        return self._step_counts.of(clients, t)

    def least_steps(self) -> np.ndarray:
        """The fewest local steps (m,) each client can do in a round (``StepCounts.least``)."""
        return self._step_counts.least()

    def most_steps(self) -> int:
        """The most local steps any client can do in a round (``StepCounts.most``)."""
        return self._step_counts.most()

    def train(self, start: torch.Tensor, clients: np.ndarray, t: int, lr_scale: torch.Tensor | None = None,
              steps: int | np.ndarray | None = None, terms: Sequence[StepTerm] = (),
              stats: LocalStats | None = None, stream: int | None = None) -> torch.Tensor:
        """End models (n, d) after local SGD steps from ``start`` (n, d).

        ``steps``: one count for all, one per client (n,), or None for ``steps_of(clients, t)``;
        ``lr_scale`` (n,) multiplies each client's step size (e.g. debiased FedAvg's nu_i);
        ``terms``: the algorithm's additions to every step's (clipped) gradient (``local_step``);
        ``stats``: filled with the clients' losses and step counts (``LocalStats``);
        ``stream``: the coordinate of the random streams (minibatches, dropout, augmentation) in
        place of t, for a client that trains twice in round t (an asynchronous task's); None: t.
        """
        with one_thread(self.device):
            x = start.detach().clone()
        return self.train_(x, clients, t, lr_scale, steps, terms, stats, stream)

    def run(self, work: Training) -> torch.Tensor:
        """``train`` with the arguments of ``work``."""
        return self.train(work.start, work.clients, work.t, lr_scale=work.lr_scale, terms=work.terms,
                          stats=work.stats)

    def train_(self, x: torch.Tensor, clients: np.ndarray, t: int, lr_scale: torch.Tensor | None = None,
               steps: int | np.ndarray | None = None, terms: Sequence[StepTerm] = (),
               stats: LocalStats | None = None, stream: int | None = None) -> torch.Tensor:
        """``train`` on the rows of ``x`` in place (same bits); returns ``x``."""
        n = x.shape[0]
        steps = self.steps_of(clients, t) if steps is None else np.broadcast_to(np.asarray(steps, np.int64), (n,))
        if stats is not None:
            stats.begin(steps)
        if n == 0:
            return x
        lr = self.step_sizes(t, n, lr_scale)
        key = t if stream is None else stream  # the random streams' coordinate
        self.task.model.train()
        chunk = self.chunk_size()
        with one_thread(self.device):
            for a in range(0, n, chunk):  # a client's result does not depend on its chunk-mates
                rows, k = slice(a, a + chunk), min(chunk, n - a)
                extra = chunk - k if self.fixed_shape else 0  # engine.shapes: pad to one shape
                xs, ids, rates, todo = (pad_rows(v[rows], extra) for v in (x, clients, lr, steps))
                rule = LocalStep(self.cfg, [(term, self.spec.views(pad_rows(term.rows[rows], extra)))
                                            for term in terms])
                losses = self._train_block(xs, ids, key, rates, todo, rule, stats is not None,
                                           stats is not None and bool(stats.quantities))
                if extra:
                    x[rows] = xs[:k]
                if losses is not None:
                    stats.add(rows, losses.cut(slice(0, k)))
        return x

    def step_sizes(self, t: int, n: int, lr_scale: torch.Tensor | None = None) -> torch.Tensor:
        """n clients' step sizes in round t: eta_l(t) (``lr_at``) times ``lr_scale``, float32."""
        # via float64: a learning rate beyond float32 becomes inf (the run then diverges, exit 4), not an error
        lr = torch.full((n,), lr_at(self.cfg, t), dtype=torch.float64, device=self.device).float()
        return lr if lr_scale is None else lr * lr_scale.to(self.device, torch.float32)

    def chunk_size(self) -> int:
        """Clients per batched call. On CPU, blocks of about 64 MB of what each client's step
        touches (``client_bytes``) stay cache- and memory-friendly (benchmarks/engine.py: 1000
        logreg clients in one call ran 1.5x slower than in blocks; 10 SVHN-CNN clients, whose
        layer outputs take 24 MB each, 18% slower in one call than in blocks of 2). On CUDA,
        blocks of up to 512 MB of what each client holds at its step's peak (``memory``) and 256
        clients (and at most the run's m) keep the GPU busy; every block there has this many rows
        (``engine.shapes``), so the caps bound the padding of a small cohort.
        A function of the model, data shape and config only: the same on every rank."""
        if self.device.type == "cuda":  # never more rows than the run has clients
            return max(1, min(MAX_FIXED_BLOCK, self.task.m, (512 << 20) // self.memory().total))
        return max(1, (64 << 20) // self.client_bytes())

    def client_bytes(self) -> int:
        """Bytes one client's local step touches, the CPU blocks' measure (``chunk_size``): what
        it holds (``memory``), with every stacked layer's output and its gradient in place of the
        activations autograd keeps (the vmap path: what it keeps)."""
        if self.net is None:
            return self.memory().total
        touched = 8 * self.net.activation_numel(dict(zip(self.spec.names, self.spec.shapes)),
                                                self.task.train_x.shape[1:], self.cfg.batch_size, self._input_dtype)
        return self._with(touched).total

    def memory(self) -> ClientMemory:
        """What one client's local step holds at its peak: its trainable parameters (an adapter's
        only: the frozen base is the rank's, held once), their gradient and update, the momentum
        buffer, its minibatch, and the activations autograd keeps for the backward pass, with the
        gradient in flight (``_activations``)."""
        return self._with(self._activations() * self.cfg.batch_size)

    def _with(self, activations: int) -> ClientMemory:
        """A client's memory with ``activations`` bytes of activations."""
        b, d = self.cfg.batch_size, self.spec.dim
        return ClientMemory(parameters=4 * d, gradients=8 * d, optimizer=4 * d if self.cfg.momentum > 0 else 0,
                            minibatch=4 * b * self.task.train_x[0].numel(), activations=activations)

    def _activations(self) -> int:
        """Activation bytes of one client's step per minibatch sample, from what autograd keeps for
        one sample's forward pass and loss (``fedmpi.saved``, counted once; the model's parameters,
        the frozen base and the client's own are not activations). On the stacked layers: what
        they keep, plus the gradient in flight, twice the largest kept tensor (the output gradient
        of the op being differentiated and its input gradient; benchmarks/RESULTS.md: 1-6% under
        the measured memory per additional LoRA client). Through vmap (a model without stacked
        rules): three times what the model's own forward keeps (``vmap`` of the gradient took
        2.05-2.78x as much per additional client on GPT-2 and a Llama, benchmarks/RESULTS.md: the
        estimate errs above, where a CUDA block it sizes still fits)."""
        if getattr(self, "_per_sample", None) is None:
            model = self.task.model
            params = {n: v.clone().requires_grad_(True) for n, v in self.spec.views(self.spec.flatten(model)).items()}
            x, y = self.task.inputs(self.task.train_x[:1]), self.task.train_y[:1]
            held = [*model.parameters(), *params.values()]
            with one_thread(self.device):
                if self.net is None:
                    k = saved.kept(lambda: self._loss_of(params, {}, x, y, None), held)
                    self._per_sample = 3 * k.total
                else:
                    stacked = {n: v.unsqueeze(0) for n, v in params.items()}
                    keys = self.dropout_keys(np.zeros(1, dtype=np.int64), 0, 0)  # dropout keeps its mask
                    loss = per_client(self.task.loss)
                    k = saved.kept(lambda: loss(self.net.forward(stacked, x[None], keys), y[None]), held)
                    self._per_sample = k.total + 2 * k.largest
        return self._per_sample

    def _train_block(self, x: torch.Tensor, clients: np.ndarray, t: int, lr: torch.Tensor,
                     steps: np.ndarray, rule: LocalStep, record: bool = False,
                     samples: bool = False) -> BlockLosses | None:
        """Local steps (``rule``) on the rows of ``x`` in place, parameter by parameter (no (n, d)
        gradient copy); client j takes ``steps[j]`` of them (afterwards its step size is 0).
        ``record``: returns the minibatch losses, zero for the clients that are done, and with
        ``samples`` the per-sample losses (``BlockLosses``). Replayed as a CUDA graph
        (``engine.graphs``) when the trainer has them, the algorithm adds no terms to the step
        (their rows are the algorithm's, not the graph's buffers) and no per-sample losses are
        asked for (an algorithm's ``client_quantities``: the loop then runs kernel by kernel)."""
        inp = self.step_inputs(clients, t, steps, masks=self.replays(rule, samples))
        return self.block_steps(x, inp, lr, steps, rule, record, samples)

    def replays(self, rule: LocalStep, samples: bool = False) -> bool:
        """Whether a block with step rule ``rule`` runs its steps as a graph replay."""
        return self._graphs is not None and not rule.terms and not samples

    def block_steps(self, x: torch.Tensor, inp: StepInputs, lr: torch.Tensor, steps: np.ndarray, rule: LocalStep,
                    record: bool = False, samples: bool = False) -> BlockLosses | None:
        """The rest of ``_train_block`` once its inputs ``inp`` are made (``step_inputs``, with
        ``masks=replays(rule, samples)``): the step loop, replayed or not, and the losses (``record``,
        ``samples``)."""
        if self.replays(rule, samples):
            losses = self._graphs.run(x, inp, lr, record)
        else:
            losses = self.run_steps(x, inp, lr, rule, record, samples)
        if not losses:
            return None
        values = minibatch_losses(losses)  # (steps, n), host float64
        done = np.arange(len(losses))[:, None] >= steps[None, :]
        values[done] = 0.0  # clients that were done
        if not samples:
            return BlockLosses(values)
        each = sample_losses(losses)  # (steps, n, b)
        each[done] = 0.0
        weights = None if inp.weights is None else inp.weights.double().cpu().numpy()
        return BlockLosses(values, SampleLosses(each, ~done, weights))

    def run_steps(self, x: torch.Tensor, inp: StepInputs, lr: torch.Tensor, rule: LocalStep,
                  record: bool = False, samples: bool = False) -> list[torch.Tensor | Deferred | Samples]:
        """The step loop of ``_train_block`` on the rows of ``x`` in place, from ``inp``: device
        operations only (no host value is read or made). Returns each step's minibatch losses
        (tensors or ``layers.Deferred``) when ``record``, else []; with ``samples`` each step's
        per-sample losses too (``layers.Samples`` or ``Deferred``)."""
        params = self.spec.views(x)
        shape = {name: (-1, *[1] * (v.dim() - 1)) for name, v in params.items()}
        rates = {name: lr.view(s) for name, s in shape.items()}
        n, losses = x.shape[0], []
        for j in range(inp.steps):
            if inp.going is not None:  # clients that are done stay put: x - 0 * d is x, bit for bit
                rates = {name: torch.where(inp.going[j], lr, 0.0).view(s) for name, s in shape.items()}
            xb, yb, wb = self._minibatch(inp, j, n)
            keys = {} if inp.keys is None else {name: inp.keys[j] for name in self._key_names}
            loss, g = self.value_and_gradients(x, xb, yb, wb, keys, record, params, samples=record and samples)
            if record:
                losses.append(loss)
            if self.cfg.grad_clip is not None:
                norms = sum(v.flatten(1).pow(2).sum(1) for v in g.values()).sqrt()
                scale = torch.clamp(self.cfg.grad_clip / (norms + 1e-12), max=1.0)
                g = {name: v * scale.view(rates[name].shape) for name, v in g.items()}
            for name, v in params.items():
                v.addcmul_(rates[name], rule.direction(name, v, g[name]), value=-1.0)  # x - lr d, one fused pass
        return losses

    def _replayed_steps(self, x: torch.Tensor, inp: StepInputs, lr: torch.Tensor,
                        record: bool) -> list[torch.Tensor | Deferred]:
        """``run_steps`` with a fresh step rule (a graph replays its momentum buffer's reset too)."""
        return self.run_steps(x, inp, lr, LocalStep(self.cfg), record)

    def dropout_keys(self, clients: np.ndarray, t: int, step: int) -> dict[str, torch.Tensor]:
        """{'<layer>.key': (n,) int64} for the model's ``KeyedDropout`` layers: one key per client,
        round and step (each layer derives its own stream from it); {} without dropout."""
        if not self._key_names:
            return {}
        keys = torch.as_tensor(self._dropout_bits(clients, t, step), device=self.device)
        return {name: keys for name in self._key_names}

    def _dropout_bits(self, clients: np.ndarray, t: int, step: int) -> np.ndarray:
        return rng.as_int64(rng.bits(rng.key(self.seed, "dropout", t, step), np.asarray(clients, dtype=np.int64)))

    def param_gradients(self, x: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor, wb: torch.Tensor | None,
                        keys: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
        """Per-client gradients {name: (n, *shape)} at the rows of ``x`` (``keys``: see ``dropout_keys``)."""
        return self.value_and_gradients(x, xb, yb, wb, keys, value=False)[1]

    def value_and_gradients(self, x: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor, wb: torch.Tensor | None,
                            keys: dict[str, torch.Tensor] | None = None, value: bool = True,
                            params: dict[str, torch.Tensor] | None = None, samples: bool = False,
                            ) -> tuple[torch.Tensor | Deferred | Samples | None, dict[str, torch.Tensor]]:
        """``param_gradients`` and, if ``value``, the minibatch losses (n,) of the same pass (else
        None); ``params``: ``spec.views(x)`` when the caller holds them already. ``samples``: the
        per-sample losses too (``layers.Samples`` or ``Deferred``): from the same pass on the stacked
        layers, else from one more forward pass per client (``sample_losses_at``)."""
        if keys is None:
            if self._key_names:
                raise ValueError("param_gradients: this model has dropout; pass keys=dropout_keys(clients, t, step)")
            keys = {}
        if self.path == "batched" and self.net is not None:
            return self.net.value_and_gradients(self.task.loss, params or self.spec.views(x), self.task.inputs(xb),
                                                yb, wb, keys, value, samples)
        if samples:
            each = self.sample_losses_at(x, xb, yb, keys)
            loss, g = self.value_and_gradients(x, xb, yb, wb, keys, True, params)
            return Samples(loss, each), g
        if self.path == "batched":
            if x.shape[0] == 1:  # vmap over one client takes other kernels (other rounding): compute it as a pair
                loss, pair = self.value_and_gradients(
                    x.expand(2, -1), xb.expand(2, *xb.shape[1:]), yb.expand(2, *yb.shape[1:]),
                    None if wb is None else wb.expand(2, -1), {n: k.expand(2) for n, k in keys.items()}, value)
                return (None if loss is None else loss[:1]), {name: v[:1] for name, v in pair.items()}
            params = self.spec.views(x)
            keys = {**keys, **expanded(self.task.model, x.shape[0])}  # the base, per client (engine.params)
            g, loss = (self._batched_grad(params, keys, xb, yb, wb) if wb is not None
                       else self._batched_grad_nw(params, keys, xb, yb))
            return (loss if value else None), g
        rows, losses = [], []
        for i in range(x.shape[0]):
            p = x[i].clone().requires_grad_(True)
            loss = self._loss_of(self.spec.views(p), {n: k[i] for n, k in keys.items()}, xb[i], yb[i],
                                 None if wb is None else wb[i])
            rows.append(torch.autograd.grad(loss, p)[0])
            losses.append(loss.detach())
        return (torch.stack(losses) if value else None), self.spec.views(torch.stack(rows))

    def sample_losses_at(self, x: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor,
                         keys: dict[str, torch.Tensor]) -> torch.Tensor:
        """Per-sample losses (n, b) of each client's minibatch at its row of ``x``, client by client
        (one forward pass each: its numbers do not depend on the others in the block)."""
        each = per_sample(self.task.loss)
        rows = []
        with torch.no_grad():
            for i in range(x.shape[0]):
                out = functional_call(self.task.model, {**self.spec.views(x[i]), **{n: k[i] for n, k in keys.items()}},
                                      (self.task.inputs(xb[i]),))
                rows.append(each(out.unsqueeze(0), yb[i].unsqueeze(0))[0])
        return torch.stack(rows)
