"""A task = the data of every client on the rank's device + the model and its loss; the dataset registry.

``build_task(cfg, device)`` gets the arrays of the dataset named by ``task.dataset`` (a
registered factory), splits them over the clients (``partition``), builds the model named by
``task.model`` (``fedmpi.models``) and puts the training and test tensors on ``device``;
minibatches are then drawn by index on the device (``fedmpi.engine.local``), never by
DataLoader workers. Client i's samples are ``train_x[order[offsets[i]:offsets[i+1]]]``.

A dataset is a factory ``(cfg) -> DataArrays`` registered with ``register_dataset`` (its own
parameters, a ``DatasetParams`` subclass, sit in the ``task`` block). It gets partitions,
optional caching (``cache=True``), device placement, image normalisation and on-device
augmentation for free. A factory may instead return a complete ``Task`` (on the CPU) when the
standard pipeline does not fit, as ``quadratic`` does. Built-in datasets:

- image datasets (fmnist, mnist, cifar10, svhn, cinic10; ``readers``): uint8 images,
  normalised per batch;
- ``synthetic``: a seeded Gaussian mixture (one mean per class), float features;
- ``quadratic``: F_i(x) = ||x - u_i||^2 / 2; client i's single "sample" is its u_i and the
  model (``scalar``) is the vector x itself, so a step on it is an exact gradient step.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import inspect
import logging
import math
import os
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import psutil
import torch
import yaml

from .. import rng
from ..config import Config, DatasetParams, TaskConfig, opt
from ..errors import InputError
from ..models.losses import quadratic
from ..participation.base import ClientInfo
from ..registry import DATASETS
from .arrays import DataArrays

log = logging.getLogger(__name__)


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

    def client_info(self, seed: int) -> ClientInfo:
        return ClientInfo(m=self.m, seed=seed, label_hist=self.label_hist, group=self.groups)

    def to(self, device: torch.device) -> "Task":
        """The same task with its model and tensors on ``device``."""
        moved = {f.name: getattr(self, f.name).to(device) for f in dataclasses.fields(self)
                 if isinstance(getattr(self, f.name), (torch.Tensor, torch.nn.Module))}
        return dataclasses.replace(self, **moved)


Factory = Callable[[Config], "DataArrays | Task"]


def register_dataset(name: str, *, params: type | None = None, check: Callable[[Config], None] | None = None,
                     cache: bool = False) -> Callable[[Factory], Factory]:
    """Decorator registering a dataset factory ``(cfg) -> DataArrays`` (or a complete ``Task``).

    ``params``: a ``DatasetParams`` subclass with the dataset's own keys (in the ``task`` block);
    ``check``: cross-key checks of the config; ``cache``: keep the arrays in an ``.npz`` under
    ``task.cache_dir``, keyed by the dataset's keys, the seed and the factory's source file."""
    return DATASETS.register(name, params=params, check=check, cache=cache)


class ScalarModel(torch.nn.Module):
    """The quadratic task's model: the vector x itself (forward ignores its input)."""

    def __init__(self, dim: int, x0: float):
        super().__init__()
        self.x = torch.nn.Parameter(torch.full((dim,), float(x0)))

    def forward(self, inp: torch.Tensor) -> torch.Tensor:
        return self.x.expand(*inp.shape[:-1], self.x.shape[0])


@dataclass
class SyntheticConfig:
    samples: int = opt(12000, "training samples of the synthetic Gaussian-mixture set", ge=1)
    test_samples: int = opt(2000, "test samples of the synthetic set", ge=1)
    features: int = opt(32, "input features (flat vectors)", ge=1)
    classes: int = opt(10, "number of classes (one Gaussian per class)", ge=2)
    separation: float = opt(1.0, "distance scale between class means (larger = easier)", gt=0, le=1e6)


@dataclass
class SyntheticParams(DatasetParams):
    synthetic: SyntheticConfig = opt(SyntheticConfig(), "shape of the synthetic dataset")


@dataclass
class FmnistParams(SyntheticParams):
    fallback_synthetic: bool = opt(True, "fmnist at the standard location missing -> synthetic (else exit 2)")


@register_dataset("synthetic", params=SyntheticParams)
def synthetic_data(cfg: Config) -> DataArrays:
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
    return DataArrays(xtr, ytr, xte, yte, s.classes)


def _image_dataset(name: str) -> Factory:
    """The factory of a dataset read from files by ``readers`` (cached by the reader itself)."""

    def load(cfg: Config) -> DataArrays:
        from . import readers

        try:
            return readers.load(name, cfg.task.root, cfg.task.cache_dir)
        except readers.DatasetMissing as e:  # absent data only; corrupt files stay errors
            if not (name == "fmnist" and cfg.task.root is None and cfg.task.fallback_synthetic):
                raise
            log.info("Fashion-MNIST not found (%s); using the synthetic dataset instead", e)
            return synthetic_data(cfg)

    load.__qualname__ = f"image_dataset_{name}"
    return load


for _name in ("fmnist", "mnist", "cifar10", "svhn", "cinic10"):
    register_dataset(_name, params=FmnistParams if _name == "fmnist" else None)(_image_dataset(_name))


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



# ----------------------------------------------------------------------------- building a task

_CACHED = ("x_train", "y_train", "x_test", "y_test", "classes", "mean", "std")


def dataset_arrays(cfg: Config) -> "DataArrays | Task":
    """What the factory of ``task.dataset`` returns (through the cache when it registered one)."""
    entry = DATASETS.get(cfg.task.dataset)
    if not entry.options.get("cache"):
        return entry.obj(cfg)
    from . import readers

    own = {k: v for k, v in dataclasses.asdict(cfg.task).items()
           if k not in {f.name for f in dataclasses.fields(TaskConfig)} or k in ("dataset", "root")}
    src = inspect.getsourcefile(entry.obj) or ""
    stat = os.stat(src) if src and os.path.exists(src) else None
    key = yaml.safe_dump({"params": own, "seed": cfg.seed, "source": src,
                          "stamp": [stat.st_size, stat.st_mtime_ns] if stat else None}, sort_keys=True)
    fingerprint = hashlib.sha256(key.encode()).hexdigest()
    path = os.path.join(os.path.expanduser(cfg.task.cache_dir or readers.default_cache_dir()),
                        f"{cfg.task.dataset}-{fingerprint[:12]}.npz")
    hit = readers._read_cache(path, fingerprint, _CACHED)
    if hit is not None:
        mean, std = (tuple(hit[k].tolist()) if hit[k].size else None for k in ("mean", "std"))
        return DataArrays(hit["x_train"], hit["y_train"], hit["x_test"], hit["y_test"], int(hit["classes"]),
                          mean, std)
    data = entry.obj(cfg)
    if isinstance(data, DataArrays):
        arrays = {**dataclasses.asdict(data), "mean": data.mean or (), "std": data.std or ()}
        readers._write_cache(path, fingerprint, arrays, _CACHED)
    return data


def _checked(data: Any, name: str) -> DataArrays:
    """The factory's arrays after the checks every dataset must pass (InputError naming it)."""
    where = f"task.dataset: {name!r}"
    if not isinstance(data, DataArrays):
        raise InputError(f"{where}: its factory must return DataArrays or a Task, got {type(data).__name__}")
    if not isinstance(data.classes, (int, np.integer)) or data.classes < 1:
        raise InputError(f"{where}: classes must be a positive integer, got {data.classes!r}")
    out = {}
    for split in ("train", "test"):
        x, y = np.asarray(getattr(data, f"x_{split}")), np.asarray(getattr(data, f"y_{split}"))
        if x.ndim < 2 or y.shape != (x.shape[0],) or x.shape[0] == 0:
            raise InputError(f"{where}: x_{split} must be (N, ...) with N > 0 and y_{split} (N,), "
                             f"got {x.shape} and {y.shape}")
        if not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= data.classes:
            raise InputError(f"{where}: y_{split} must be integer labels in [0, {data.classes})")
        if data.image and (x.dtype != np.uint8 or x.ndim != 4 or len(data.mean) != x.shape[1]
                           or len(data.std or ()) != x.shape[1]):
            raise InputError(f"{where}: images with mean/std must be uint8 (N, C, H, W) with C values each, "
                             f"got {x.dtype} {x.shape}")
        if not data.image:
            if not np.issubdtype(x.dtype, np.floating) or not np.isfinite(x).all():
                raise InputError(f"{where}: x_{split} must hold finite floats (or uint8 images with mean/std)")
            x = x.astype(np.float32, copy=False)
        out[f"x_{split}"], out[f"y_{split}"] = x, y.astype(np.int64, copy=False)
    if out["x_train"].shape[1:] != out["x_test"].shape[1:]:
        raise InputError(f"{where}: train and test samples differ in shape "
                         f"({out['x_train'].shape[1:]} vs {out['x_test'].shape[1:]})")
    return dataclasses.replace(data, classes=int(data.classes), **out)


def build_task(cfg: Config, device: torch.device) -> Task:
    """Get, partition and place the data of ``cfg.task`` on ``device``; build the model."""
    from ..models import build_model, loss_fn
    from .partition import client_groups, label_histogram, partition

    data = dataset_arrays(cfg)
    if isinstance(data, Task):
        return data.to(device)
    data = _checked(data, cfg.task.dataset)
    xtr, ytr, xte, yte, classes = data.x_train, data.y_train, data.x_test, data.y_test, data.classes
    mean = std = None
    if data.image:
        mean = torch.tensor(data.mean, dtype=torch.float32, device=device)
        std = torch.tensor(data.std, dtype=torch.float32, device=device)
    m = cfg.task.clients
    if m > len(ytr):
        raise InputError(f"task.clients: {m} clients but only {len(ytr)} training samples")
    parts = partition(ytr, m, cfg.task.partition, rng.generator(cfg.seed, "partition"))
    sizes = np.array([len(p) for p in parts])
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    order = np.concatenate(parts).astype(np.int64)
    model = build_model(cfg.task.model, tuple(xtr.shape[1:]), classes, seed=cfg.seed, params=cfg.task)
    return Task(model=model.to(device), loss=loss_fn(cfg.task.model),
                train_x=torch.from_numpy(np.ascontiguousarray(xtr)).to(device),
                train_y=torch.from_numpy(ytr.astype(np.int64)).to(device),
                test_x=torch.from_numpy(np.ascontiguousarray(xte)).to(device),
                test_y=torch.from_numpy(yte.astype(np.int64)).to(device),
                order=torch.from_numpy(order).to(device), offsets=offsets, classes=classes,
                label_hist=label_histogram(ytr, parts, classes),
                groups=client_groups(m, cfg.task.partition), mean=mean, std=std, image=data.image)


def client_info(cfg: Config) -> ClientInfo:
    """The clients' label histograms and groups for ``cfg`` without keeping the tensors."""
    return build_task(cfg, torch.device("cpu")).client_info(cfg.seed)
