"""A task = the data of every client on the rank's device + the model and its loss.

``fedmpi.build.build_task(cfg, device)`` makes one from the config; minibatches are then drawn
by index on the device (``fedmpi.engine.local``), never by DataLoader workers. Client i's
samples are ``train_x[order[offsets[i]:offsets[i+1]]]``.

The ``quadratic`` dataset lives here because its factory returns a complete ``Task``:
F_i(x) = ||x - u_i||^2 / 2; client i's single "sample" is its u_i and the model (``scalar``)
is the vector x itself, so a step on it is an exact gradient step.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional

import numpy as np
import torch

from .data import synthetic_text  # noqa: F401  (registers synthetic_text, before quadratic below)
from .data.arrays import TextInfo
from .data.datasets import DatasetParams, register_dataset
from .errors import InputError
from .models.losses import quadratic
from .models.nets import ScalarModel
from .participation.base import ClientInfo
from .schema import opt

if TYPE_CHECKING:
    from .config import Config


@dataclass
class Task:
    """Everything the engine needs about data and model, on one device."""

    model: torch.nn.Module  # template module (its parameters are not trained directly)
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (outputs, targets) -> mean loss
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    order: torch.Tensor  # (N,) sample ids grouped by client
    offsets: np.ndarray  # (m + 1,) client i owns order[offsets[i]:offsets[i+1]]
    classes: int  # 0 for regression (quadratic)
    label_hist: np.ndarray | None  # (m, classes) per-client label counts
    groups: np.ndarray | None  # (m,) data group per client (partition 'groups')
    mean: torch.Tensor | None = None  # per-channel normalisation of uint8 images
    std: torch.Tensor | None = None
    image: bool = False
    local_test_order: torch.Tensor | None = None  # client i's local test samples (partition.local_test):
    local_test_offsets: np.ndarray | None = None  # X[local_test_order[off[i]:off[i+1]]], off (m + 1,), X being
    local_test_source: Literal["train", "test"] = "train"  # train_x (held out of training) or test_x (the dataset's)
    text: TextInfo | None = None  # a text task's tokenizer (token ids (N, T) in, next tokens out)

    @property
    def m(self) -> int:
        return len(self.offsets) - 1

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def inputs(self, xb: torch.Tensor) -> torch.Tensor:
        """Raw stored samples -> model inputs (uint8 images are scaled and normalised:
        x / (255 std) - mean / std per channel, two float32 roundings per element)."""
        if not self.image:
            return xb
        scale, shift = self._normalisation
        shape = [1] * (xb.dim() - 3) + [-1, 1, 1]
        return xb.float().mul_(scale.view(shape)).sub_(shift.view(shape))

    @functools.cached_property
    def _normalisation(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(1 / (255 std), mean / std): made once, not at every minibatch (four small ops each)."""
        return 1.0 / (255.0 * self.std), self.mean / self.std

    def client_info(self, seed: int, rounds: int | None = None) -> ClientInfo:
        return ClientInfo(m=self.m, seed=seed, label_hist=self.label_hist, group=self.groups, rounds=rounds)

    def to(self, device: torch.device) -> "Task":
        """The same task with its model and tensors on ``device``."""
        moved = {f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)
                 if isinstance(getattr(self, f.name), (torch.Tensor, torch.nn.Module))}
        return dataclasses.replace(self, **moved)



@dataclass
class QuadraticParams(DatasetParams):
    u: Optional[list] = opt(None, "client optima u_i (numbers, or equal-length lists)")
    x0: float = opt(0.0, "initial model value")


def _check_quadratic(cfg: Config) -> None:
    t, m = cfg.task, cfg.task.clients
    if t.model != "scalar":
        raise InputError(f"task.model: the quadratic task needs model 'scalar', got {t.model!r}")
    if t.u is None:
        raise InputError("task.u: the quadratic task needs the client optima u (one per client)")
    if len(t.u) != m:
        raise InputError(f"task.u: needs one entry per client ({m}), got {len(t.u)}")
    dims = {len(x) if isinstance(x, list) else 0 for x in t.u}
    if len(dims) != 1 or not all(_is_num_or_numlist(x) for x in t.u):
        raise InputError("task.u: entries must all be numbers or all be lists of numbers of one length")


def _is_num_or_numlist(x: Any) -> bool:
    num = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)  # noqa: E731
    return num(x) or (isinstance(x, list) and len(x) > 0 and all(num(v) for v in x))


@register_dataset("quadratic", params=QuadraticParams, check=_check_quadratic)
def _quadratic(cfg: Config) -> Task:
    u = np.asarray(cfg.task.u, dtype=np.float64)
    if u.ndim == 1:
        u = u[:, None]
    m, dim = u.shape
    ut = torch.tensor(u, dtype=torch.float32)
    dummy = torch.zeros(m, 1)
    return Task(model=ScalarModel(dim, cfg.task.x0), loss=quadratic,
                train_x=dummy, train_y=ut, test_x=dummy, test_y=ut,
                order=torch.arange(m), offsets=np.arange(m + 1), classes=0,
                label_hist=None, groups=None)
