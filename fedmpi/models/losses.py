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
    gradient ``grad(out, y) -> d per_sample / d out`` (row by row, same shape as ``out``).

    ``mean_of_samples``: the minibatch loss is the mean of the per-sample losses (the engine then
    takes it from them; False for ``TokenLoss``); ``perplexity``: the loss is a mean negative
    log-likelihood per token, whose exp the evaluator reports."""

    mean_of_samples = True
    perplexity = False

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


#: the target of a position without one (PyTorch's ``ignore_index``; ``fedmpi.data.arrays.IGNORE``)
IGNORE = -100


class TokenLoss(Loss):
    """Token-level cross-entropy of a causal language model: outputs (..., b, T, vocab), targets
    (..., b, T) with ``IGNORE`` (-100) where a position has no target (padding, a document's last
    token). The minibatch loss is the mean over the minibatch's target tokens, sum_j sum_t
    ce_jt / #targets (PyTorch's and Hugging Face's ``ignore_index`` mean); a sample's (sequence's)
    loss is the mean over its own target tokens (0 without one), so the minibatch loss is not the
    mean of the samples' (``mean_of_samples`` False). Evaluation averages over the tokens
    (``eval_totals``): the loss, its exp (the perplexity) and the next-token accuracy."""

    mean_of_samples = False
    perplexity = True

    def __init__(self) -> None:
        super().__init__("token_cross_entropy", self._per_sample)

    @staticmethod
    def tokens(out: Tensor, y: Tensor) -> Tensor:
        """Each position's cross-entropy (..., b, T), 0 where the target is ``IGNORE``."""
        return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1), ignore_index=IGNORE,
                               reduction="none").view(y.shape)

    def __call__(self, out: Tensor, y: Tensor) -> Tensor:
        """The mean over the minibatch's target tokens (..., ), leading dims kept."""
        count = (y != IGNORE).sum((-2, -1)).clamp(min=1)
        return self.tokens(out, y).sum((-2, -1)) / count

    def _per_sample(self, out: Tensor, y: Tensor) -> Tensor:
        return self.tokens(out, y).sum(-1) / (y != IGNORE).sum(-1).clamp(min=1)

    def eval_totals(self, out: Tensor, y: Tensor) -> tuple[Tensor, Tensor, int]:
        """``eval_totals`` over the target tokens of k models' outputs on one batch."""
        valid = y != IGNORE
        hits = ((out.argmax(-1) == y) & valid).flatten(1).sum(1).double()
        return self.tokens(out, y).double().flatten(1).sum(1), hits, int(valid[0].sum())


token_cross_entropy = TokenLoss()


def eval_totals(loss: Callable[[Tensor, Tensor], Tensor], out: Tensor, y: Tensor,
                classes: bool) -> tuple[Tensor, Tensor | None, int]:
    """Evaluation sums of k models' outputs (k, B, ...) on one batch with targets (k, B, ...): each
    model's summed loss (k,) float64, its number of correct predictions (k,) float64 (None without
    ``classes``), and the number of units both are sums over (samples; a ``TokenLoss``'s target
    tokens). A metric is a sum over batches divided by the sum of the units."""
    if isinstance(loss, TokenLoss):
        return loss.eval_totals(out, y)
    hits = (out.argmax(-1) == y).sum(1).double() if classes else None
    return per_sample(loss)(out, y).double().sum(1), hits, y.shape[1]


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
