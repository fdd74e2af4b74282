"""Local SGD of many clients at once.

``LocalTrainer.train(start, clients, t)`` runs s local SGD steps (``local_step``: optional
momentum, weight decay, FedProx's proximal term, SCAFFOLD's correction) for every listed
client, starting from the rows of ``start`` (n, d), and returns the end models (n, d). Two
paths compute the same thing:

- batched: the clients' parameters are stacked and one ``vmap(grad(loss))`` call
  (``torch.func``) computes every client's gradient per step;
- sequential: the reference loop over clients with ordinary autograd.

Minibatches are drawn by index on the device from counter-based streams keyed by
(seed, "batch", round, step) and the client's global id, so a client's batches do not
depend on which rank trains it or which other clients train with it. They are drawn
uniformly with replacement (``full_gradient`` uses every local sample instead). Dropout
masks come from the same kind of stream, (seed, "dropout", round, step) and the client id
(``models.dropout``).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch.func import functional_call, grad, vmap

from .. import rng
from ..config import TrainConfig
from ..data.task import Task
from ..models.dropout import KeyedDropout
from .local_step import LocalStep
from .params import ParamSpec

_CONV_MODELS = ("svhn_cnn", "cifar_cnn", "cinic_cnn", "vgg11")


def lr_at(cfg: TrainConfig, t: int) -> float:
    """eta_l at 0-based round t (``constant`` or ``inv_sqrt``: eta_0 / sqrt(t/10 + 1))."""
    if cfg.lr_schedule == "inv_sqrt":
        return cfg.lr / math.sqrt(t / 10.0 + 1.0)
    return cfg.lr


def choose_path(engine: str, model_name: str, device: torch.device) -> str:
    """``auto``: batched, except conv nets on CPU, where vmapped convolutions lose to the loop
    (measured in benchmarks/engine.py; see benchmarks/RESULTS.md)."""
    if engine != "auto":
        return engine
    if model_name in _CONV_MODELS and device.type == "cpu":
        return "sequential"
    return "batched"


class LocalTrainer:
    """Local training of a rank's clients on ``task``; see the module docstring."""

    def __init__(self, task: Task, cfg: TrainConfig, seed: int, model_name: str = "", path: str | None = None):
        self.task = task
        self.cfg = cfg
        self.seed = seed
        self.spec = ParamSpec.of(task.model)
        self.device = task.train_x.device
        self.path = path or choose_path(cfg.engine, model_name, self.device)
        self._sizes = torch.as_tensor(task.sizes, device=self.device)
        self._offsets = torch.as_tensor(task.offsets[:-1], device=self.device)
        model = task.model
        self._key_names = [f"{name}.key" for name, mod in model.named_modules() if isinstance(mod, KeyedDropout)]

        def loss_of(params: dict, keys: dict, xb: torch.Tensor, yb: torch.Tensor,
                    wb: torch.Tensor | None) -> torch.Tensor:
            out = functional_call(model, {**params, **keys}, (task.inputs(xb),))
            if wb is None:
                return task.loss(out, yb)
            per_sample = vmap(lambda o, y: task.loss(o.unsqueeze(0), y.unsqueeze(0)))(out, yb)
            return (per_sample * wb).sum()

        self._loss_of = loss_of
        self._grad = grad(loss_of)
        self._batched_grad = vmap(self._grad, in_dims=(0, 0, 0, 0, 0), randomness="different")
        self._batched_grad_nw = vmap(lambda p, k, x, y: self._grad(p, k, x, y, None), randomness="different")

    # ------------------------------------------------------------------ data
    def batch(self, clients: np.ndarray, t: int, step: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """Inputs (n, b, ...), targets (n, b, ...) and sample weights (n, b) or None."""
        cid = torch.as_tensor(clients, device=self.device)
        sizes = self._sizes[cid]
        if self.cfg.full_gradient:
            width = int(sizes.max().item())
            j = torch.arange(width, device=self.device)
            local = torch.minimum(j[None, :], (sizes - 1)[:, None])
            weights = (j[None, :] < sizes[:, None]).float() / sizes[:, None].float()
        else:
            b = self.cfg.batch_size
            counters = clients.astype(np.int64)[:, None] * b + np.arange(b)[None, :]
            u = torch.as_tensor(rng.uniform(rng.key(self.seed, "batch", t, step), counters), device=self.device)
            local = torch.minimum((u * sizes[:, None]).long(), (sizes - 1)[:, None])
            weights = None
        ids = self.task.order[self._offsets[cid][:, None] + local].reshape(-1)
        n, b = local.shape
        xb = self.task.train_x.index_select(0, ids).view(n, b, *self.task.train_x.shape[1:])
        yb = self.task.train_y.index_select(0, ids).view(n, b, *self.task.train_y.shape[1:])
        if self.cfg.augment and self.task.image:
            xb = self._augment(xb, clients, t, step)
        return xb, yb, weights

    def _augment(self, xb: torch.Tensor, clients: np.ndarray, t: int, step: int) -> torch.Tensor:
        from ..data.augment import augment

        n, b = xb.shape[:2]
        counters = (clients.astype(np.int64)[:, None, None] * b + np.arange(b)[None, :, None]) * 3 + np.arange(3)
        u = torch.as_tensor(rng.uniform(rng.key(self.seed, "augment", t, step), counters),
                            dtype=torch.float32, device=self.device)
        # augmentation works on [0, 255] floats; Task.inputs normalises afterwards
        return augment(xb.float(), list(self.cfg.augment), self.cfg.augment_mode, u)

    # ------------------------------------------------------------------ training
    def train(self, start: torch.Tensor, clients: np.ndarray, t: int, lr_scale: torch.Tensor | None = None,
              steps: int | None = None, prox: float = 0.0, correction: torch.Tensor | None = None) -> torch.Tensor:
        """End models (n, d) after ``steps`` (default s) local SGD steps from ``start`` (n, d).

        ``lr_scale`` (n,) multiplies each client's step size (e.g. debiased FedAvg's nu_i);
        ``prox`` adds FedProx's mu (x - start) and ``correction`` (n, d) SCAFFOLD's c - c_i to
        every step's (clipped) gradient (``local_step``).
        """
        return self.train_(start.detach().clone(), clients, t, lr_scale, steps, prox, correction)

    def train_(self, x: torch.Tensor, clients: np.ndarray, t: int, lr_scale: torch.Tensor | None = None,
               steps: int | None = None, prox: float = 0.0, correction: torch.Tensor | None = None) -> torch.Tensor:
        """``train`` on the rows of ``x`` in place (same bits); returns ``x``."""
        n = x.shape[0]
        if n == 0:
            return x
        lr = torch.full((n,), lr_at(self.cfg, t), dtype=torch.float32, device=self.device)
        if lr_scale is not None:
            lr = lr * lr_scale.to(self.device, torch.float32)
        self.task.model.train()
        chunk = self.chunk_size()
        anchor = x.clone() if prox else None  # x_start of the proximal term
        for a in range(0, n, chunk):  # a client's result does not depend on its chunk-mates
            rows = slice(a, a + chunk)
            rule = LocalStep(self.cfg, prox, None if anchor is None else {"": anchor[rows]},
                             None if correction is None else {"": correction[rows]})
            self._train_block(x[rows], clients[rows], t, lr[rows], steps, rule)
        return x

    def chunk_size(self) -> int:
        """Clients per batched call. Each client's step touches its parameters, gradients and
        minibatch; blocks of about 64 MB of those stay cache- and memory-friendly (measured in
        benchmarks/engine.py: 1000 logreg clients in one call ran 1.5x slower than in blocks)."""
        sample = self.task.train_x[0].numel()
        per_client = 12 * self.spec.dim + 4 * self.cfg.batch_size * sample
        return max(8, (64 << 20) // per_client)

    def _train_block(self, x: torch.Tensor, clients: np.ndarray, t: int, lr: torch.Tensor,
                     steps: int | None, rule: LocalStep) -> None:
        """Local steps (``rule``) on the rows of ``x`` in place."""
        for step in range(self.cfg.local_steps if steps is None else steps):
            xb, yb, wb = self.batch(clients, t, step)
            g = self.gradients(x, xb, yb, wb, self.dropout_keys(clients, t, step))
            if self.cfg.grad_clip is not None:
                norms = g.norm(dim=1, keepdim=True)
                g = g * torch.clamp(self.cfg.grad_clip / (norms + 1e-12), max=1.0)
            x.sub_(lr[:, None] * rule.direction("", x, g))

    def dropout_keys(self, clients: np.ndarray, t: int, step: int) -> dict[str, torch.Tensor]:
        """{'<layer>.key': (n,) int64} for the model's ``KeyedDropout`` layers: one key per client,
        round and step (each layer derives its own stream from it); {} without dropout."""
        if not self._key_names:
            return {}
        k = rng.bits(rng.key(self.seed, "dropout", t, step), np.asarray(clients, dtype=np.int64))
        keys = torch.as_tensor(rng.as_int64(k), device=self.device)
        return {name: keys for name in self._key_names}

    def gradients(self, x: torch.Tensor, xb: torch.Tensor, yb: torch.Tensor, wb: torch.Tensor | None,
                  keys: dict[str, torch.Tensor] | None = None) -> torch.Tensor:
        """Per-client gradients (n, d) at the rows of ``x`` (``keys``: see ``dropout_keys``)."""
        if keys is None:
            if self._key_names:
                raise ValueError("gradients: this model has dropout; pass keys=dropout_keys(clients, t, step)")
            keys = {}
        if self.path == "batched":
            if x.shape[0] == 1:  # a batch of one takes other kernels (other rounding): compute it as a pair
                pair = self.gradients(x.expand(2, -1), xb.expand(2, *xb.shape[1:]), yb.expand(2, *yb.shape[1:]),
                                      None if wb is None else wb.expand(2, -1), {n: k.expand(2) for n, k in keys.items()})
                return pair[:1]
            params = self.spec.views(x)
            g = (self._batched_grad(params, keys, xb, yb, wb) if wb is not None
                 else self._batched_grad_nw(params, keys, xb, yb))
            return self.spec.cat(g, x.shape[0])
        rows = []
        for i in range(x.shape[0]):
            p = x[i].clone().requires_grad_(True)
            loss = self._loss_of(self.spec.views(p), {n: k[i] for n, k in keys.items()}, xb[i], yb[i],
                                 None if wb is None else wb[i])
            rows.append(torch.autograd.grad(loss, p)[0])
        return torch.stack(rows)
