"""Training losses that work on one client's minibatch or on many clients' minibatches at once.

A ``Loss`` is called like a plain loss function, ``loss(out, y)`` -> the mean over the
minibatch, but it keeps leading dimensions: outputs (..., b, k) and targets (..., b[, k])
give one mean per leading index, so the stacked engine (``engine.layers``) gets every
client's loss from one call on (n, b, k) outputs. ``per_sample`` gives the (..., b) losses
(weighted sums, evaluation); ``output_grad`` is the closed-form gradient of the minibatch
loss with respect to the outputs, which lets a single linear layer skip autograd entirely.

A plug-in may still give ``Task.loss`` as a plain function (scalar mean over one minibatch);
the engine then maps it over clients with ``torch.func.vmap``.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

Tensor = torch.Tensor


class Loss:
    """A per-sample loss ``per_sample(out, y) -> (..., b)`` with its optional closed-form output
    gradient ``grad(out, y) -> d per_sample / d out`` (row by row, same shape as ``out``)."""

    def __init__(self, name: str, per_sample: Callable[[Tensor, Tensor], Tensor],
                 grad: Callable[[Tensor, Tensor], Tensor] | None = None,
                 grad_and_raw: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]] | None = None,
                 finish: Callable[[np.ndarray], np.ndarray] | None = None):
        """``grad_and_raw(out, y)``: ``grad``'s result (the same bits) and a raw form of the
        per-sample losses from what it computes anyway; ``finish(raw)`` -> the losses (..., b), on
        many steps' raw values at once, as float64 numpy on the host (a handful of tiny torch ops
        per step cost more than their numpy twins once: for reporting, the rounding may differ
        from ``per_sample``'s)."""
        self.name = name
        self.per_sample = per_sample
        self._grad = grad
        self._grad_and_raw = grad_and_raw or (lambda out, y: (grad(out, y), per_sample(out, y)))
        self._finish = finish or (lambda raw: raw)

    def __call__(self, out: Tensor, y: Tensor) -> Tensor:
        """Mean over the minibatch (dim -1 of ``per_sample``), leading dims kept."""
        return self.per_sample(out, y).mean(-1)

    @property
    def has_output_grad(self) -> bool:
        return self._grad is not None

    def output_grad(self, out: Tensor, y: Tensor, weights: Tensor | None = None) -> Tensor:
        """d/d out of the minibatch mean (``weights`` (..., b): of sum_j w_j loss_j instead)."""
        return self._scale(self._grad(out, y), out, weights)

    def output_grad_and_raw(self, out: Tensor, y: Tensor, weights: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """``output_grad`` and the raw losses of this minibatch, for ``minibatch_losses``."""
        g, raw = self._grad_and_raw(out, y)
        return self._scale(g, out, weights), raw

    def sample_losses(self, raw: np.ndarray) -> np.ndarray:
        """The per-sample losses (..., b) from stacked raw losses (host)."""
        return self._finish(raw)

    def minibatch_losses(self, raw: np.ndarray, weights: np.ndarray | None = None) -> np.ndarray:
        """The minibatch losses (...,) (mean, or ``weights``-weighted sum) from stacked raw losses (host)."""
        each = self._finish(raw)
        return each.mean(-1) if weights is None else (each * weights).sum(-1)

    @staticmethod
    def _scale(g: Tensor, out: Tensor, weights: Tensor | None) -> Tensor:
        return g.div_(out.shape[-2]) if weights is None else g.mul_(weights.unsqueeze(-1).to(g.dtype))

    def __repr__(self) -> str:
        return f"Loss({self.name})"


def _ce_per_sample(logits: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none").view(y.shape)


def _ce_grad(logits: Tensor, y: Tensor) -> Tensor:
    """softmax(z) - onehot(y)."""
    return _ce_grad_and_raw(logits, y, raw=False)[0]


def _ce_grad_and_raw(logits: Tensor, y: Tensor, raw: bool = True) -> tuple[Tensor, Tensor | None]:
    """``_ce_grad`` and softmax(z)_y (..., b, 1), read from the same softmax: one small gather per
    step, where a cross-entropy call cost about 5% of an anchor-task round."""
    g = torch.softmax(logits, -1)
    idx = y.unsqueeze(-1)
    p = g.gather(-1, idx) if raw else None
    return g.scatter_add_(-1, idx, torch.full_like(g[..., :1], -1.0)), p


def _ce_finish(p: np.ndarray) -> np.ndarray:
    """-log softmax(z)_y, capped at -log(smallest normal float32), about 87."""
    return -np.log(np.maximum(p[..., 0], np.finfo(np.float32).tiny))


def _hinge_terms(logits: Tensor, y: Tensor, margin: float) -> Tensor:
    return margin - logits.gather(-1, y.unsqueeze(-1)) + logits  # margin - z_y + z_j for every j


def _hinge_per_sample(logits: Tensor, y: Tensor, margin: float = 1.0) -> Tensor:
    hinge = _hinge_terms(logits, y, margin).clamp(min=0).sum(-1) - margin  # the j = y term is exactly margin
    return hinge / logits.shape[-1]


def _hinge_grad(logits: Tensor, y: Tensor, margin: float = 1.0) -> Tensor:
    """a_j / classes for j != y, (1 - sum_j a_j) / classes for y, a_j = [margin - z_y + z_j >= 0]
    (the subgradient autograd takes through ``clamp``)."""
    a = (_hinge_terms(logits, y, margin) >= 0).to(logits.dtype)
    a.scatter_(-1, y.unsqueeze(-1), 1.0 - a.sum(-1, keepdim=True))  # a_y = 1 is in the sum
    return a.div_(logits.shape[-1])


def _quadratic_per_sample(out: Tensor, u: Tensor) -> Tensor:
    return 0.5 * (out - u).pow(2).sum(-1)


def _quadratic_grad(out: Tensor, u: Tensor) -> Tensor:
    return out - u


def _mse_per_sample(out: Tensor, y: Tensor) -> Tensor:
    return (out - y).pow(2).mean(-1)


def _mse_grad(out: Tensor, y: Tensor) -> Tensor:
    return (out - y).mul_(2.0 / out.shape[-1])


def _quadratic_grad_and_raw(out: Tensor, u: Tensor) -> tuple[Tensor, Tensor]:
    g = out - u
    return g, g.clone()  # the gradient is scaled in place afterwards


def _quadratic_finish(diff: np.ndarray) -> np.ndarray:
    return 0.5 * (diff * diff).sum(-1)


cross_entropy = Loss("cross_entropy", _ce_per_sample, _ce_grad, _ce_grad_and_raw, _ce_finish)
mse = Loss("mse", _mse_per_sample, _mse_grad)
"""Mean squared error over the k targets per sample (regression datasets: ``classes`` 0)."""
multiclass_hinge = Loss("multiclass_hinge", _hinge_per_sample, _hinge_grad)
"""sum_{j != y} max(0, 1 - z_y + z_j) / classes per sample (``F.multi_margin_loss`` semantics)."""
quadratic = Loss("quadratic", _quadratic_per_sample, _quadratic_grad, _quadratic_grad_and_raw, _quadratic_finish)
"""||out - u||^2 / 2 per sample (the quadratic task: out is the model x itself)."""


def per_sample(loss: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    """Per-sample losses (n, b) of outputs (n, b, ...) and targets (n, b, ...) for any loss: a
    ``Loss`` directly, a plain function (scalar mean over a minibatch) through vmap."""
    if isinstance(loss, Loss):
        return loss.per_sample
    return torch.func.vmap(torch.func.vmap(lambda o, t: loss(o.unsqueeze(0), t.unsqueeze(0))))


def per_client(loss: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    """Minibatch means (n,) of outputs (n, b, ...) and targets (n, b, ...) for any loss."""
    if isinstance(loss, Loss):
        return loss
    return torch.func.vmap(loss)
