"""Guards that stop a run which cannot succeed, with one clear line instead of a crash.

- ``step_bytes``: the working set of one local step (minibatch x model), estimated before the
  first round so that, e.g., ``train.batch_size: 2000000000`` is refused at once (exit 2)
  instead of dying in an allocation minutes later.
- ``step_inputs_bytes``: a block's minibatch ids (and augmentation draws) are drawn for all its
  local steps of a round at once (``engine.local.StepInputs``), so ``train.local_steps``,
  ``train.local_epochs`` or a steps file can make them huge; counted in the same check.
- ``nonfinite`` / ``stop_if_diverged``: a loss or model that became NaN or infinite ends the
  run on every rank with ``Diverged`` (exit 4, status ``diverged``). The runner checks the
  evaluated models and losses at every evaluation and the whole state before every
  checkpoint, so a diverged state never replaces the last good checkpoint.
"""

from __future__ import annotations

import math

import torch

from .errors import Diverged
from .runtime import World
from .saved import kept

#: Clients one local step is estimated for (all local clients when fewer). Not a floor of the
#: engine: its blocks hold as many clients as fit in 64 MB (CPU) or 512 MB (CUDA), at least one
#: (``LocalTrainer.chunk_size``), so a model whose single step is that big trains fewer at once.
STEP_CLIENTS = 8


def _saved_bytes(task, n: int) -> int:
    """Bytes autograd keeps for the backward pass of the training loss on ``n`` samples."""
    return kept(lambda: task.loss(task.model(task.inputs(task.train_x[:n])), task.train_y[:n])).total


def step_bytes(task, batch: int, local_clients: int, path: str = "batched", client_state: int = 0) -> int:
    """A lower bound of the memory one local SGD step allocates: the minibatches of
    ``min(STEP_CLIENTS, local clients)`` clients (float input, index and augmentation draws per sample)
    and the activations autograd keeps for backward, for all of them at once on the batched
    path and for one client at a time on the sequential one, and ``client_state`` bytes for each
    of them (its trainable parameters, their gradient and update, its optimizer state:
    ``LocalTrainer.memory``; the frozen base is the rank's, counted once by the caller)."""
    clients = min(STEP_CLIENTS, max(local_clients, 1))
    n = min(2, task.train_x.shape[0])
    saved = 0
    if n == 2:  # what one more sample adds; the model's own tensors cancel out
        saved = max(_saved_bytes(task, 2) - _saved_bytes(task, 1), 0)
    together = 1 if path == "sequential" else clients
    return batch * (clients * (4 * task.train_x[0].numel() + 8 + 12) + together * saved) + clients * client_state


#: bytes per client, step and minibatch sample of a block's inputs: the int64 ids (device) and,
#: on the host while they are drawn, the float64 uniforms and two int64 index arrays
_ID_BYTES = 8 + 3 * 8
_AUGMENT_BYTES = 3 * 4  # float32 crop/flip uniforms per sample and step
_MASK_BYTES = 1 + 8  # per client and step: still-stepping flag, dropout key


def step_inputs_bytes(steps: int, clients: int, batch: int, augment: bool, full_gradient: bool) -> int:
    """The memory one block's ``StepInputs`` take: ``steps`` (the most a client does in a round) x
    ``clients`` (the block) x ``batch`` samples of ids (full_gradient: one row of ids for every
    step) and augmentation draws, and per-step masks and dropout keys."""
    per_step = clients * (_MASK_BYTES + batch * (_AUGMENT_BYTES if augment else 0))
    ids = clients * batch * _ID_BYTES * (1 if full_gradient else steps)
    return steps * per_step + ids


# ----------------------------------------------------------------------------- divergence

def nonfinite(tensors: dict[str, torch.Tensor]) -> str | None:
    """The name of the first floating-point tensor holding a NaN or an infinity, or None. A number
    (a 0-d tensor: a plug-in's declared float) may be infinite, the usual sentinel of a best loss so
    far; NaN never. A diverged model shows in its arrays, which must be finite."""
    for name, t in tensors.items():
        if not (torch.is_tensor(t) and t.is_floating_point()):
            continue
        if bool(torch.isnan(t).any()) if t.dim() == 0 else not bool(torch.isfinite(t).all()):
            return name
    return None


def nonfinite_eval(row: dict[str, float], models: dict[str, torch.Tensor]) -> str | None:
    """Rank 0, after an evaluation: a loss metric or an evaluated model that is not finite."""
    for k, v in row.items():
        if "loss" in k and not math.isfinite(v):
            return f"{k} is {v}"
    bad = nonfinite({f"model {k!r}" if k else "the model": v for k, v in models.items()})
    return f"{bad} has non-finite parameters" if bad else None


def stop_if_diverged(world: World, finding: str | None, rounds_done: int, last_checkpoint: int | None,
                     folder: str) -> None:
    """Collective: if any rank has a ``finding``, every rank raises ``Diverged``."""
    if world.size > 1:
        if world.max_float(1.0 if finding else 0.0) == 0:
            return
        finding = finding or "another rank's state is not finite"
    elif not finding:
        return
    kept = (f"the last good checkpoint (round {last_checkpoint}) is kept in {folder}"
            if last_checkpoint is not None else "no checkpoint was written")
    raise Diverged(f"{finding} at round {rounds_done}; {kept} (lower train.lr, or set train.grad_clip)")
