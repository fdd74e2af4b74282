"""Loss and accuracy of one or many flat models on a dataset, batched.

``evaluate(task, spec, models, x, y)`` evaluates k models (k, d) at once: each data batch
goes through a ``vmap`` over the models, so k client models cost one pass over the data,
not k Python-level passes. Sums are accumulated in float64 in a fixed batch order, so the
numbers are identical wherever they are computed.
"""

from __future__ import annotations

import torch
from torch.func import functional_call, vmap

from ..data.task import Task
from .params import ParamSpec


@torch.no_grad()
def evaluate(task: Task, spec: ParamSpec, models: torch.Tensor, x: torch.Tensor, y: torch.Tensor,
             batch_size: int = 2000) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Mean loss (k,) and accuracy (k,) (None for regression tasks) of each row of ``models``."""
    models = models.reshape(-1, spec.dim)
    k, n = models.shape[0], x.shape[0]
    params = spec.views(models)
    task.model.eval()

    def one_model(p: dict, xb: torch.Tensor, yb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = functional_call(task.model, p, (xb,))
        per_sample = vmap(lambda o, t: task.loss(o.unsqueeze(0), t.unsqueeze(0)))(out, yb)
        if task.classes:
            correct = (out.argmax(-1) == yb).sum()
        else:
            correct = torch.zeros((), device=out.device)
        return per_sample.double().sum(), correct

    many = vmap(one_model, in_dims=(0, None, None))
    loss = torch.zeros(k, dtype=torch.float64, device=models.device)
    correct = torch.zeros(k, dtype=torch.float64, device=models.device)
    for s in range(0, n, batch_size):
        xb = task.inputs(x[s:s + batch_size])
        lb, cb = many(params, xb, y[s:s + batch_size])
        loss += lb
        correct += cb.double()
    task.model.train()
    return loss / n, (correct / n if task.classes else None)
