"""The dataset registry, the ``task`` block's common keys and the built-in dataset factories.

A dataset is a factory ``(cfg) -> DataArrays`` registered with ``register_dataset`` (its own
parameters, a ``DatasetParams`` subclass, sit in the ``task`` block). It gets partitions,
optional caching (``cache=True``), device placement, image normalisation and on-device
augmentation for free (``fedmpi.task.build_task``). A factory may instead return a complete
``fedmpi.task.Task`` (on the CPU) when the standard pipeline does not fit, as ``quadratic``
(``fedmpi.task``) does. Built-in datasets here:

- image datasets (fmnist, mnist, cifar10, svhn, cinic10; ``readers``): uint8 images,
  normalised per batch;
- ``synthetic``: a seeded Gaussian mixture (one mean per class), float features;
- ``leaf``: LEAF's JSON files, each user a client (``leaf``; ``task.partition.kind: natural``);
- text (``text``; token sequences, ``DataArrays.text``, the keys of ``task.text``):
  ``shakespeare`` (the embedded default: Shakespeare's plays by speaking role),
  ``leaf_shakespeare`` (LEAF's Shakespeare JSON) and ``jsonl`` (records with a user field).
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Literal, Optional, Union

import numpy as np
import psutil
import yaml

from .. import provenance, rng
from ..errors import InputError
from ..registry import DATASETS, MODELS
from ..schema import Digest, opt
from .arrays import IGNORE, DataArrays, TextInfo

if TYPE_CHECKING:
    from ..config import Config
    from ..task import Task

log = logging.getLogger(__name__)


@dataclass
class PartitionConfig:
    kind: Literal["iid", "dirichlet", "shards", "groups", "natural"] = opt(
        "iid", "how training samples are split over clients (natural: by the dataset's own client ids)")
    alpha: float = opt(0.5, "Dirichlet concentration (dirichlet, groups)", gt=0)
    classes_per_client: int = opt(1, "classes per client (shards)", ge=1)
    groups: int = opt(2, "client groups that split the classes (groups)", ge=1)
    local_test: Union[float, Literal["dataset"]] = opt(
        0.0, "each client's local test split (per-client metrics; never trained on): the fraction of its samples "
             "held out, or dataset: its own test samples (natural partitions whose dataset gives them, e.g. LEAF)",
        ge=0, lt=1, digest=Digest(absent=0.0))  # none: the checkpoints before this key


@dataclass
class TaskConfig:
    """The ``task`` block's common keys; the chosen dataset's and model's own keys join them."""

    dataset: str = opt("fmnist", "dataset; fmnist falls back to synthetic (with a one-line notice) when absent",
                       selects=DATASETS)
    root: Optional[str] = opt(None, "dataset folder; null = the standard location")
    cache_dir: Optional[str] = opt(None, "where converted datasets are cached; null = ~/.cache/fedmpi")
    clients: int = opt(100, "number of clients m (N)", ge=1)
    partition: PartitionConfig = opt(PartitionConfig(), "data partition over clients")
    model: str = opt("logreg", "model architecture (quadratic task: scalar)", selects=MODELS)


@dataclass
class DatasetParams(TaskConfig):
    """Base of a dataset's own parameters (they sit in the ``task`` block)."""


Factory = Callable[["Config"], "DataArrays | Task"]


def register_dataset(name: str, *, params: type | None = None, check: Callable[["Config"], None] | None = None,
                     cache: bool = False) -> Callable[[Factory], Factory]:
    """Decorator registering a dataset factory ``(cfg) -> DataArrays`` (or a complete ``Task``).

    ``params``: a ``DatasetParams`` subclass with the dataset's own keys (in the ``task`` block);
    ``check``: cross-key checks of the config; ``cache``: keep the arrays in an ``.npz`` under
    ``task.cache_dir``, keyed by the dataset's keys, the seed, the content of the factory's source
    file and the content of every file its keys name (name the files a factory reads in keys)."""
    return DATASETS.register(name, params=params, check=check, cache=cache)


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
class LeafSplits:
    train: str = opt("", "LEAF training split: a .json file or a folder of them")
    test: str = opt("", "LEAF test split: a .json file or a folder of them")


@dataclass
class LeafConfig(LeafSplits):
    classes: Optional[int] = opt(None, "number of classes; null = 1 + the largest label; 0 = regression (MSE)",
                                 ge=0)


@dataclass
class LeafParams(DatasetParams):
    leaf: LeafConfig = opt(LeafConfig(), "LEAF JSON files (users are the clients: partition.kind natural)")


@register_dataset("leaf", params=LeafParams, cache=True)
def leaf_data(cfg: Config) -> DataArrays:
    """LEAF's JSON layout, each user a client (``fedmpi.data.leaf``)."""
    from . import leaf

    return leaf.load(cfg)


# ----------------------------------------------------------------------------- text (fedmpi.data.text)

MAX_CONTEXT = 1 << 16


@dataclass
class TextConfig:
    tokenizer: str = opt("bytes", "bytes (built in: ids 0-255 the UTF-8 bytes, 256 pad, 257 bos, 258 eos) or a "
                                  "tokenizer.json, or the model folder holding it (needs pip install 'fedmpi[llm]')")
    context: int = opt(64, "tokens per sequence T (a sample is one sequence; train.batch_size counts sequences)",
                       ge=1, le=MAX_CONTEXT)
    documents: Literal["pack", "pad", "truncate"] = opt(
        "pack", "pack: a client's documents one after another, cut every T tokens (a sequence may span two; "
                "targets never do); pad: each document starts a sequence, its last one right-padded; truncate: "
                "each document's first T tokens only")


@dataclass
class TextParams(DatasetParams):
    """The keys every text dataset has."""

    text: TextConfig = opt(TextConfig(), "tokenizer and sequences of a text dataset")


@dataclass
class ShakespeareConfig:
    plays: Optional[list[str]] = opt(None, "plays by file name (hamlet, macbeth, the-tempest, ...); null = all 38")
    test_fraction: float = opt(0.2, "each role's last speeches held out as its local test split", ge=0, lt=1)
    min_speeches: int = opt(2, "roles with fewer speeches are left out (McMahan et al. keep roles of two lines)",
                            ge=1)
    fallback_synthetic: bool = opt(True, "plays missing at the standard location -> seeded synthetic text, with "
                                         "a one-line notice (else exit 2)")


@dataclass
class ShakespeareParams(TextParams):
    shakespeare: ShakespeareConfig = opt(ShakespeareConfig(), "Shakespeare's plays, each speaking role a client "
                                                              "(task.root: null = $FEDMPI_DATA/shakespeare)")


@register_dataset("shakespeare", params=ShakespeareParams)
def shakespeare_data(cfg: Config) -> DataArrays:
    """The embedded default: Shakespeare's plays, each speaking role a client (``fedmpi.data.text``)."""
    from . import text

    return text.shakespeare_arrays(cfg)


@dataclass
class LeafTextParams(TextParams):
    leaf_shakespeare: LeafSplits = opt(LeafSplits(), "LEAF's Shakespeare JSON files (users are the clients)")


@register_dataset("leaf_shakespeare", params=LeafTextParams, cache=True)
def leaf_shakespeare_data(cfg: Config) -> DataArrays:
    """LEAF's Shakespeare JSON as text, each user a client (``fedmpi.data.text``)."""
    from . import text

    return text.leaf_shakespeare_arrays(cfg)


@dataclass
class JsonlConfig:
    train: str = opt("", "training records: a .jsonl file or a folder of them")
    test: Optional[str] = opt(None, "test records (same layout); null = each user's last test_fraction of records")
    user_field: str = opt("user_id", "the field naming a record's user (its client)")
    test_fraction: float = opt(0.1, "with test null: each user's last records held out as its local test split",
                               ge=0, lt=1)
    loss: Literal["all", "response"] = opt("all", "all: every token is learnt; response: only responses (assistant "
                                                  "turns), prompts are context")


@dataclass
class JsonlParams(TextParams):
    jsonl: JsonlConfig = opt(JsonlConfig(), "JSONL text, instruction or chat records with a user field")


def _check_jsonl(cfg: Config) -> None:
    j = cfg.task.jsonl
    if j.test is None and j.test_fraction == 0:
        raise InputError("task.jsonl.test_fraction: 0 with task.jsonl.test null leaves no test records; "
                         "give task.jsonl.test or a fraction > 0")


@register_dataset("jsonl", params=JsonlParams, check=_check_jsonl, cache=True)
def jsonl_data(cfg: Config) -> DataArrays:
    """JSONL text, instruction or chat records of users (``fedmpi.data.text``)."""
    from . import text

    return text.jsonl_arrays(cfg)


# ----------------------------------------------------------------------------- what a factory gives

_CACHED = ("x_train", "y_train", "x_test", "y_test", "classes", "mean", "std", "client_train", "client_test", "text")


def dataset_arrays(cfg: Config) -> "DataArrays | Task":
    """What the factory of ``task.dataset`` returns (through the cache when it registered one)."""
    entry = DATASETS.get(cfg.task.dataset)
    if not entry.options.get("cache"):
        return entry.obj(cfg)
    from . import readers, text

    # the dataset's own keys; not the model's (a model folder's weights would be hashed every run)
    declared = {f.name for f in dataclasses.fields(entry.params)} if entry.params else set()
    own = {k: v for k, v in dataclasses.asdict(cfg.task).items()
           if k in declared - {f.name for f in dataclasses.fields(TaskConfig)} or k in ("dataset", "root")}
    src = inspect.getsourcefile(entry.obj) or ""
    code = provenance.source_hash(src) if src and os.path.exists(src) else None
    code = provenance.fedmpi_source() if entry.builtin else code  # a built-in's reader may live elsewhere
    # the files its keys name, and a text dataset's tokenizer (the model folder's, by default), are
    # inputs of the run, read from the cache or not; their content is in the key, so a
    # regenerated file is a miss
    named = provenance.named_files(own, folders=True) + (text.tokenizer_files(cfg) if "text" in own else [])
    files = {p: provenance.note_input(p)["sha256"] for p in named}
    key = yaml.safe_dump({"params": own, "seed": cfg.seed, "source": src, "code": code, "files": files},
                         sort_keys=True)
    fingerprint = hashlib.sha256(key.encode()).hexdigest()
    path = os.path.join(os.path.expanduser(cfg.task.cache_dir or readers.default_cache_dir()),
                        f"{cfg.task.dataset}-{fingerprint[:12]}.npz")
    hit = readers._read_cache(path, fingerprint, _CACHED)
    if hit is not None:
        mean, std = (tuple(hit[k].tolist()) if hit[k].size else None for k in ("mean", "std"))
        ids = {k: hit[k] if hit[k].size else None for k in ("client_train", "client_test")}
        text = TextInfo(**json.loads(str(hit["text"]))) if str(hit["text"]) else None
        return DataArrays(hit["x_train"], hit["y_train"], hit["x_test"], hit["y_test"], int(hit["classes"]),
                          mean, std, **ids, text=text)
    data = entry.obj(cfg)
    if isinstance(data, DataArrays):
        ids = {k: () if getattr(data, k) is None else getattr(data, k) for k in ("client_train", "client_test")}
        text = json.dumps(dataclasses.asdict(data.text)) if isinstance(data.text, TextInfo) else ""
        arrays = {**dataclasses.asdict(data), "mean": data.mean or (), "std": data.std or (), **ids, "text": text}
        readers._write_cache(path, fingerprint, arrays, _CACHED)
    return data


def checked_arrays(data: Any, name: str) -> DataArrays:
    """The factory's arrays after the checks every dataset must pass (InputError naming it)."""
    where = f"task.dataset: {name!r}"
    if not isinstance(data, DataArrays):
        raise InputError(f"{where}: its factory must return DataArrays or a Task, got {type(data).__name__}")
    if not isinstance(data.classes, (int, np.integer)) or data.classes < 0:
        raise InputError(f"{where}: classes must be a positive integer (or 0 for regression), got {data.classes!r}")
    out = {}
    for split in ("train", "test"):
        x, y = (_checked_tokens if data.text is not None else _checked_samples)(data, split, where)
        out[f"x_{split}"], out[f"y_{split}"] = x, y
    if out["x_train"].shape[1:] != out["x_test"].shape[1:] or out["y_train"].shape[1:] != out["y_test"].shape[1:]:
        raise InputError(f"{where}: train and test samples differ in shape "
                         f"({out['x_train'].shape[1:]} vs {out['x_test'].shape[1:]}, targets "
                         f"{out['y_train'].shape[1:]} vs {out['y_test'].shape[1:]})")
    for split, samples in (("train", "training sample"), ("test", "test sample")):
        ids = getattr(data, f"client_{split}")
        if ids is None:
            continue
        ids = np.asarray(ids)
        if ids.shape != (out[f"x_{split}"].shape[0],) or not np.issubdtype(ids.dtype, np.integer):
            raise InputError(f"{where}: client_{split} must hold one integer client id per {samples}")
        out[f"client_{split}"] = ids.astype(np.int64, copy=False)
    if data.client_test is not None and data.client_train is None:
        raise InputError(f"{where}: client_test needs client_train (the training samples' client ids)")
    return dataclasses.replace(data, classes=int(data.classes), **out)


def _checked_samples(data: DataArrays, split: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    """One split's (x, y) of a dataset of labelled (or regression) samples, checked."""
    x, y = np.asarray(getattr(data, f"x_{split}")), np.asarray(getattr(data, f"y_{split}"))
    if data.classes == 0 and y.ndim == 1:  # regression: one target per sample
        y = y[:, None]
    targets = (x.shape[0],) if data.classes else (x.shape[0], y.shape[-1])
    if x.ndim < 2 or y.shape != targets or x.shape[0] == 0:
        want = "(N,)" if data.classes else "(N,) or (N, k)"
        raise InputError(f"{where}: x_{split} must be (N, ...) with N > 0 and y_{split} {want}, "
                         f"got {x.shape} and {np.shape(getattr(data, f'y_{split}'))}")
    if data.classes == 0:
        if not np.issubdtype(y.dtype, np.number) or not np.isfinite(y).all():
            raise InputError(f"{where}: y_{split} must hold finite numbers (regression: classes 0)")
        y = y.astype(np.float32)
    elif not np.issubdtype(y.dtype, np.integer) or y.min() < 0 or y.max() >= data.classes:
        raise InputError(f"{where}: y_{split} must be integer labels in [0, {data.classes})")
    if data.image and (x.dtype != np.uint8 or x.ndim != 4 or len(data.mean) != x.shape[1]
                       or len(data.std or ()) != x.shape[1]):
        raise InputError(f"{where}: images with mean/std must be uint8 (N, C, H, W) with C values each, "
                         f"got {x.dtype} {x.shape}")
    if not data.image:
        if not np.issubdtype(x.dtype, np.floating) or not np.isfinite(x).all():
            raise InputError(f"{where}: x_{split} must hold finite floats (or uint8 images with mean/std)")
        x = x.astype(np.float32, copy=False)
    return x, (y.astype(np.int64, copy=False) if data.classes else y)


def _checked_tokens(data: DataArrays, split: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    """One split's (x, y) of a text dataset (``DataArrays.text``), checked: int64 ids (N, T) in
    [0, vocab) and targets of the same shape, each an id or ``IGNORE``."""
    t = data.text
    if not isinstance(t, TextInfo):
        raise InputError(f"{where}: text must be a TextInfo, got {type(t).__name__}")
    vocab = t.vocab_size
    if data.classes != vocab or data.image:
        raise InputError(f"{where}: a text dataset's classes must be its vocabulary size ({vocab}), without mean/std")
    specials = {"pad_id": t.pad_id, "bos_id": t.bos_id, "eos_id": t.eos_id}
    for k, v in specials.items():
        if (v is not None or k == "pad_id") and not (isinstance(v, (int, np.integer)) and 0 <= v < vocab):
            raise InputError(f"{where}: text.{k} must be a token id in [0, {vocab}), got {v!r}")
    x, y = np.asarray(getattr(data, f"x_{split}")), np.asarray(getattr(data, f"y_{split}"))
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0 or y.shape != x.shape:
        raise InputError(f"{where}: x_{split} and y_{split} must be token sequences (N, T) with N, T > 0, "
                         f"got {x.shape} and {y.shape}")
    if not (np.issubdtype(x.dtype, np.integer) and np.issubdtype(y.dtype, np.integer)):
        raise InputError(f"{where}: x_{split} and y_{split} must hold integer token ids, got {x.dtype}, {y.dtype}")
    if x.min() < 0 or x.max() >= vocab:
        raise InputError(f"{where}: x_{split} must hold token ids in [0, {vocab})")
    if ((y < 0) & (y != IGNORE)).any() or y.max() >= vocab:
        raise InputError(f"{where}: y_{split} must hold token ids in [0, {vocab}) or {IGNORE} (no target)")
    if split == "train" and (y == IGNORE).all():
        raise InputError(f"{where}: y_train has no target (all {IGNORE}): nothing to train on")
    return x.astype(np.int64, copy=False), y.astype(np.int64, copy=False)
