"""A task = the data of every client on the rank's device + the model and its loss.

``build_task(cfg, device)`` reads the dataset (``readers``), splits it over the clients
(``partition``), and puts the training and test tensors on ``device``; minibatches are
then drawn by index on the device (``fedmpi.engine.local``), never by DataLoader workers.
Client i's samples are ``train_x[order[offsets[i]:offsets[i+1]]]``.

Three kinds of data:
- image datasets (fmnist, mnist, cifar10, svhn, cinic10): uint8 images, normalised per batch;
- ``synthetic``: a seeded Gaussian mixture (one mean per class), float features;
- ``quadratic``: F_i(x) = ||x - u_i||^2 / 2; client i's single "sample" is its u_i and the
  model (``scalar``) is the vector x itself, so a step on it is an exact gradient step.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import psutil
import torch

from .. import rng
from ..config import Config
from ..errors import InputError
from ..models.losses import quadratic
from ..participation.base import ClientInfo


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
    notes: list[str] = field(default_factory=list)

    @property
    def m(self) -> int:
        return len(self.offsets) - 1

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    def inputs(self, xb: torch.Tensor) -> torch.Tensor:
        """Raw stored samples -> model inputs (uint8 images are scaled and normalised)."""
        if not self.image:
            return xb
        shape = [1] * (xb.dim() - 3) + [-1, 1, 1]
        return xb.float().mul_((1.0 / (255.0 * self.std)).view(shape)).sub_((self.mean / self.std).view(shape))

    def client_info(self, seed: int) -> ClientInfo:
        return ClientInfo(m=self.m, seed=seed, label_hist=self.label_hist, group=self.groups)


class ScalarModel(torch.nn.Module):
    """The quadratic task's model: the vector x itself (forward ignores its input)."""

    def __init__(self, dim: int, x0: float):
        super().__init__()
        self.x = torch.nn.Parameter(torch.full((dim,), float(x0)))

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        return self.x.expand(*inp.shape[:-1], self.x.shape[0])


def _quadratic(cfg: Config, device: torch.device) -> Task:
    u = np.asarray(cfg.task.u, dtype=np.float64)
    if u.ndim == 1:
        u = u[:, None]
    m, dim = u.shape
    ut = torch.tensor(u, dtype=torch.float32, device=device)
    dummy = torch.zeros(m, 1, device=device)
    return Task(model=ScalarModel(dim, cfg.task.x0).to(device), loss=quadratic,  # F_i(x) = ||x - u_i||^2 / 2
                train_x=dummy, train_y=ut, test_x=dummy, test_y=ut,
                order=torch.arange(m, device=device), offsets=np.arange(m + 1), classes=0,
                label_hist=None, groups=None)


def synthetic_data(cfg: Config) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """A seeded Gaussian mixture: class means on a sphere of radius ``separation``."""
    s = cfg.task.synthetic
    need = 8 * (s.samples + s.test_samples + s.classes) * s.features  # float64 while drawing
    free = psutil.virtual_memory().available
    if need > 0.5 * free:
        raise InputError(f"task.synthetic: {s.samples + s.test_samples} samples and {s.classes} class means of "
                         f"{s.features} features need {need / 2**30:.1f} GiB, more than half of the "
                         f"{free / 2**30:.1f} GiB available")
    gen = rng.generator(cfg.seed, "synthetic")
    means = gen.normal(size=(s.classes, s.features))
    means *= s.separation * np.sqrt(s.features) / np.linalg.norm(means, axis=1, keepdims=True) / 2
    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = gen.integers(0, s.classes, size=n)
        x = means[y] + gen.normal(size=(n, s.features))
        return x.astype(np.float32), y.astype(np.int64)
    xtr, ytr = draw(s.samples)
    xte, yte = draw(s.test_samples)
    return xtr, ytr, xte, yte, s.classes


def _load_images(cfg: Config):
    from . import readers

    try:
        return readers.load(cfg.task.dataset, cfg.task.root, cfg.task.cache_dir), None
    except readers.DatasetMissing as e:  # absent data only; corrupt files stay errors
        fallback = cfg.task.dataset == "fmnist" and cfg.task.root is None and cfg.task.fallback_synthetic
        if not fallback:
            raise
        return None, f"notice: Fashion-MNIST not found ({e}); using the synthetic dataset instead"


def build_task(cfg: Config, device: torch.device) -> Task:
    """Load, partition and place the data of ``cfg.task`` on ``device``; build the model."""
    if cfg.task.dataset == "quadratic":
        return _quadratic(cfg, device)
    from ..models import build_model, loss_fn
    from .partition import client_groups, label_histogram, partition

    notes: list[str] = []
    image = False
    mean = std = None
    data = None
    if cfg.task.dataset != "synthetic":
        data, note = _load_images(cfg)
        if note:
            notes.append(note)
    if data is not None:
        xtr, ytr, xte, yte, classes = data.x_train, data.y_train, data.x_test, data.y_test, data.classes
        image = True
        mean = torch.tensor(data.mean, dtype=torch.float32, device=device)
        std = torch.tensor(data.std, dtype=torch.float32, device=device)
    else:
        xtr, ytr, xte, yte, classes = synthetic_data(cfg)
    m = cfg.task.clients
    if m > len(ytr):
        raise InputError(f"task.clients: {m} clients but only {len(ytr)} training samples")
    parts = partition(ytr, m, cfg.task.partition, rng.generator(cfg.seed, "partition"))
    sizes = np.array([len(p) for p in parts])
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    order = np.concatenate(parts).astype(np.int64)
    model = build_model(cfg.task.model, tuple(xtr.shape[1:]), classes, hidden=cfg.task.hidden, seed=cfg.seed)
    return Task(model=model.to(device), loss=loss_fn(cfg.task.model),
                train_x=torch.from_numpy(np.ascontiguousarray(xtr)).to(device),
                train_y=torch.from_numpy(ytr.astype(np.int64)).to(device),
                test_x=torch.from_numpy(np.ascontiguousarray(xte)).to(device),
                test_y=torch.from_numpy(yte.astype(np.int64)).to(device),
                order=torch.from_numpy(order).to(device), offsets=offsets, classes=classes,
                label_hist=label_histogram(ytr, parts, classes),
                groups=client_groups(m, cfg.task.partition), mean=mean, std=std, image=image, notes=notes)


def client_info(cfg: Config) -> ClientInfo:
    """The clients' label histograms and groups for ``cfg`` without keeping the tensors."""
    task = build_task(cfg, torch.device("cpu"))
    for n in task.notes:
        print(n, file=sys.stderr)
    return task.client_info(cfg.seed)
