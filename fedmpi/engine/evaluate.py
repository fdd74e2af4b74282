"""Loss and accuracy of one or many flat models on a dataset, batched.

``evaluate(task, spec, models, x, y)`` evaluates k models (k, d) at once: each data batch
goes through the stacked layers (``engine.layers``; a ``vmap`` over the models for other
modules), so k client models cost one pass over the data, not k Python-level passes. Sums
are accumulated in float64 in a fixed batch order, with one intra-op thread on CPU
(``engine.threads``), so the numbers are identical wherever they are computed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import weakref

import torch
from torch.func import functional_call, vmap

from ..models.losses import eval_totals
from .layers import StackedNet, conv_impl
from .params import ParamSpec, expanded
from .threads import one_thread

if TYPE_CHECKING:
    from ..task import Task

_NETS: "weakref.WeakKeyDictionary[torch.nn.Module, StackedNet | None]" = weakref.WeakKeyDictionary()


def _stacked(model: torch.nn.Module, device: torch.device) -> StackedNet | None:
    if model not in _NETS:
        _NETS[model] = StackedNet.compile(model, conv_impl(device))
    return _NETS[model]


@torch.no_grad()
def evaluate(task: Task, spec: ParamSpec, models: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
             batch_size: int = 2000) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Mean loss (k,) and accuracy (k,) (None for regression tasks) of each row of ``models``: over
    the samples, or, for a token loss (``models.losses.TokenLoss``), over the target tokens (NaN
    when there are none)."""
    models = models.reshape(-1, spec.dim)
    k, n = models.shape[0], x.shape[0]
    params = spec.views(models)
    net = _stacked(task.model, models.device)
    task.model.eval()

    def one_model(p: dict, xb: torch.Tensor) -> torch.Tensor:
        return functional_call(task.model, p, (xb,))

    outputs = vmap(one_model, in_dims=(0, None))
    base = {**params, **expanded(task.model, k)} if net is None else params  # each model's own products
    loss = torch.zeros(k, dtype=torch.float64, device=models.device)
    correct = torch.zeros(k, dtype=torch.float64, device=models.device)
    units = 0  # samples (a token loss: target tokens)
    with one_thread(models.device):
        for s in range(0, n, batch_size):
            xb, yb = task.inputs(x[s:s + batch_size]), y[s:s + batch_size]
            out = net.forward(params, xb.expand(k, *xb.shape)) if net is not None else outputs(base, xb)
            total, hits, count = eval_totals(task.loss, out, yb.expand(k, *yb.shape), bool(task.classes))
            loss += total
            if hits is not None:
                correct += hits
            units += count
    task.model.train()
    return loss / units, (correct / units if task.classes else None)
