"""Dataset readers: Fashion-MNIST/MNIST (IDX), CIFAR-10 (python pickles), SVHN (format 2
.mat), CINIC-10 (PNG folders) -> uint8 ``(N, C, H, W)`` arrays plus int64 labels.

Each dataset is converted once into an ``.npz`` cache (one file per dataset and source
folder, under ``cache_dir``, ``$FEDMPI_CACHE`` or ``~/.cache/fedmpi``); the cache records a
fingerprint of the source files (paths and contents; sizes and mtimes for a folder of many
files) and is rebuilt when they change or when it is unreadable. Every problem with the source files raises a one-line
``InputError`` that starts with the offending path and names the expected layout.

Sizes are checked before data is read or inflated: gzip files are decompressed as a stream
that stops at the size the format allows (an IDX file's header, ``MAX_PICKLE_BYTES`` for a
CIFAR-10 batch), so a gzip bomb costs no more memory than a genuine file; an IDX header that
promises more than half the available memory, or another size than the file (a gzip's trailer
records its inflated size), or another count than its labels file, is refused before any image
is inflated; images are inflated in place into their array (no second copy); training and test
images must have one shape.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import math
import os
import pickle
import struct
import tempfile
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import BinaryIO, Callable, Iterator

import numpy as np
import psutil

from .. import provenance, safepickle
from ..errors import InputError
from ..inputs import check_regular, open_input
from .arrays import DataArrays

CACHE_VERSION = 1
MAX_PICKLE_BYTES = 256 * 2**20  # a CIFAR-10 batch is 31 MB


ImageData = DataArrays  # what the readers return: uint8 images (N, C, H, W) with mean/std


class DatasetMissing(InputError):
    """The dataset's folder or one of its files does not exist (callers may fall back)."""


@dataclass(frozen=True)
class _Format:
    layout: str  # "expected ..." text of error messages
    sources: Callable[[str], list[str]]  # root -> source files (raises DatasetMissing)
    read: Callable[[str, list[str]], dict]  # (root, sources) -> arrays
    mean: tuple[float, ...]
    std: tuple[float, ...]
    default_root: str


def data_home() -> str:
    return os.environ.get("FEDMPI_DATA") or os.path.join(os.path.expanduser("~"), "data")


def standard_root(dataset: str) -> str:
    """The folder searched when ``task.root`` is null (Debian's for FMNIST/MNIST,
    ``$FEDMPI_DATA/<name>`` -- default ``~/data/<name>`` -- for the others)."""
    fmt = _format(dataset)
    if os.path.isabs(fmt.default_root):
        return fmt.default_root
    return os.path.join(data_home(), fmt.default_root)


def default_cache_dir() -> str:
    return os.environ.get("FEDMPI_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "fedmpi")


def load(dataset: str, root: str | None = None, cache_dir: str | None = None) -> ImageData:
    """Read ``dataset`` from ``root`` (null: ``standard_root``), through the cache."""
    fmt = _format(dataset)
    root = os.path.abspath(os.path.expanduser(root or standard_root(dataset)))
    if not os.path.isdir(root):
        raise DatasetMissing(f"{root}: missing dataset folder ({fmt.layout})")
    sources = fmt.sources(root)
    fingerprint = _fingerprint(dataset, root, sources)
    cache = os.path.join(os.path.expanduser(cache_dir or default_cache_dir()),
                         f"{dataset}-{hashlib.sha256(root.encode()).hexdigest()[:12]}.npz")
    arrays = _read_cache(cache, fingerprint)
    if arrays is None:
        arrays = fmt.read(root, sources)
        train, test = arrays["x_train"].shape[1:], arrays["x_test"].shape[1:]
        if train != test:
            shape = lambda s: "x".join(map(str, s))  # noqa: E731
            raise InputError(f"{root}: test images are {shape(test)}, training images {shape(train)}; "
                             f"they must have one shape ({fmt.layout})")
        _write_cache(cache, fingerprint, arrays)
    return ImageData(x_train=arrays["x_train"], y_train=arrays["y_train"], x_test=arrays["x_test"],
                     y_test=arrays["y_test"], classes=int(arrays["classes"]), mean=fmt.mean, std=fmt.std)


def _format(dataset: str) -> _Format:
    if dataset not in FORMATS:
        raise InputError(f"task.dataset: no image reader for {dataset!r} (readers: {', '.join(FORMATS)})")
    return FORMATS[dataset]


# ----------------------------------------------------------------------------- cache

_ARRAYS = ("x_train", "y_train", "x_test", "y_test", "classes")
_CONTENT_KEYED = 64  # sources hashed by content at most


def _fingerprint(dataset: str, root: str, sources: list[str]) -> str:
    """The cache key: the sources' contents (``provenance``; each is noted as an input of the run),
    so a rewritten file is never served from the cache. A folder of more than ``_CONTENT_KEYED``
    files (cinic10's images) is keyed by sizes and times: reading it all at every run costs more
    than the conversion the cache saves."""
    h = hashlib.sha256(f"{CACHE_VERSION}\0{dataset}\0{root}".encode())
    by_content = len(sources) <= _CONTENT_KEYED
    for p in sources:
        if by_content:
            key = provenance.note_input(p)["sha256"]
        else:
            st = os.stat(p)
            key = f"{st.st_size}\0{st.st_mtime_ns}"
        h.update(f"\0{os.path.relpath(p, root)}\0{key}".encode())
    return h.hexdigest()


def _read_cache(path: str, fingerprint: str, keys: tuple[str, ...] = _ARRAYS) -> dict | None:
    """The cached arrays, or None when absent, stale or unreadable (then it is rebuilt)."""
    try:
        with open_input(path, "cache file") as fh, np.load(fh, allow_pickle=False) as z:
            if str(z["fingerprint"]) != fingerprint:
                return None
            return {k: z[k] for k in keys}
    except Exception:  # missing, truncated, not an npz, keys absent: rebuild
        return None


def _write_cache(path: str, fingerprint: str, arrays: dict, keys: tuple[str, ...] = _ARRAYS) -> None:
    """Atomic write (temp file + rename); an unwritable cache folder only costs speed."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-", suffix=".npz")
    except OSError:
        return
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, fingerprint=np.array(fingerprint), **{k: np.asarray(arrays[k]) for k in keys})
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass


# ----------------------------------------------------------------------------- helpers

@contextlib.contextmanager
def _opened(path: str, layout: str) -> Iterator[tuple[BinaryIO, BinaryIO, bool]]:
    """(reader, raw file, whether gzip): gunzipped on the fly when the file is gzip (detected by
    its magic bytes; GzipFile inflates only what is read). Read errors become InputError."""
    try:
        with open_input(path, f"dataset file ({layout})") as raw:
            gz = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            with (gzip.GzipFile(fileobj=raw) if gz else raw) as fh:
                yield fh, raw, gz
    except (EOFError, zlib.error, gzip.BadGzipFile):
        raise InputError(f"{path}: corrupt or truncated gzip ({layout})") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or e.__class__.__name__}) ({layout})") from None


def _read_bytes(path: str, layout: str, limit: int | Callable[[bytes], int], head: int = 0) -> bytes:
    """File contents (gunzipped when gzip). More than ``limit`` bytes -- or, when ``limit`` is a
    function, than ``limit(first head bytes)`` -- is refused before reading or inflating past
    the limit (plus one byte)."""
    with _opened(path, layout) as (fh, _, gz):
        data = fh.read(head)
        cap = limit(data) if callable(limit) else limit
        data += fh.read(cap + 1 - len(data))
    if len(data) > cap:
        allowed = "its header announces" if callable(limit) else "allowed"
        raise InputError(f"{path}: holds more than the {cap} bytes {allowed}"
                         f"{' (decompressed)' if gz else ''} ({layout})")
    return data


def _present(path: str, layout: str) -> bool:
    """Whether the dataset file ``path`` is there; one that is there but is no regular file (a
    FIFO, a device) is refused, not taken as missing (``fedmpi.inputs``)."""
    if not os.path.exists(path):
        return False
    check_regular(path, f"dataset file ({layout})")
    return True


def _require(paths: list[str], layout: str) -> list[str]:
    for p in paths:
        if not _present(p, layout):
            raise DatasetMissing(f"{p}: missing ({layout})")
    return paths


def _labels(y: np.ndarray, classes: int, path: str, layout: str) -> np.ndarray:
    y = np.asarray(y).astype(np.int64).ravel()
    if y.size and (y.min() < 0 or y.max() >= classes):
        raise InputError(f"{path}: labels outside 0..{classes - 1} ({layout})")
    return y


# ----------------------------------------------------------------------------- IDX (FMNIST, MNIST)

_IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_IDX_LAYOUT = ("expected the IDX files train-images-idx3-ubyte, train-labels-idx1-ubyte, "
               "t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each gzipped (.gz) or raw")


def _idx_sources(root: str) -> list[str]:
    out = []
    for name in _IDX_FILES:
        p = os.path.join(root, name)
        if _present(p + ".gz", _IDX_LAYOUT):
            p += ".gz"
        elif not _present(p, _IDX_LAYOUT):
            raise DatasetMissing(f"{p}.gz: missing ({_IDX_LAYOUT})")
        out.append(p)
    return out


def _idx_dims(path: str, ndim: int, header: bytes) -> tuple[int, ...]:
    """The dimensions an IDX header of ``ndim``-D unsigned bytes announces; refused when it is
    not one or they need more than half the available memory."""
    head = 4 + 4 * ndim
    if len(header) < head or header[:3] != b"\x00\x00\x08" or header[3] != ndim:
        raise InputError(f"{path}: not an IDX file of {ndim}-D unsigned bytes (bad magic number; {_IDX_LAYOUT})")
    dims = struct.unpack(f">{ndim}I", header[4:head])
    need = math.prod(dims)  # exact: no int64 wrap-around
    free = psutil.virtual_memory().available
    if need > free // 2:
        raise InputError(f"{path}: header announces {need / 2**30:.1f} GiB of images, more than half of the "
                         f"{free / 2**30:.1f} GiB available ({_IDX_LAYOUT})")
    return dims


def _idx_header(path: str, ndim: int) -> tuple[int, ...]:
    with _opened(path, _IDX_LAYOUT) as (fh, _, _):
        return _idx_dims(path, ndim, fh.read(4 + 4 * ndim))


def _idx_array(path: str, ndim: int) -> np.ndarray:
    """Parse one IDX file of unsigned bytes with ``ndim`` dimensions."""
    head = 4 + 4 * ndim
    with _opened(path, _IDX_LAYOUT) as (fh, raw, gz):
        dims = _idx_dims(path, ndim, fh.read(head))
        total = head + math.prod(dims)
        stored = _stored_size(raw, gz)  # a gzip's own record of its inflated size (mod 2^32)
        if stored != total % (2**32 if gz else 2**64):  # refused before inflating anything
            _idx_size_error(path, dims, total, stored > total % 2**32, gz)
        body = np.empty(total - head, dtype=np.uint8)  # inflated in place: the memory check holds
        view, got = memoryview(body), 0
        while got < body.size and (n := fh.readinto(view[got:got + (16 << 20)])):  # GzipFile.readinto
            got += n  # inflates into a temporary bytes object of the size asked: ask for 16 MiB at a time
        if got != body.size or fh.read(1):
            _idx_size_error(path, dims, total, got == body.size, gz)
    return body.reshape(dims)


def _idx_size_error(path: str, dims: tuple[int, ...], total: int, more: bool, gz: bool) -> None:
    if more:
        raise InputError(f"{path}: holds more than the {total} bytes its header announces"
                         f"{' (decompressed)' if gz else ''} ({_IDX_LAYOUT})")
    raise InputError(f"{path}: truncated IDX file (header says {'x'.join(map(str, dims))}; {_IDX_LAYOUT})")


def _stored_size(raw: BinaryIO, gz: bool) -> int:
    """The file's size, or for gzip the inflated size its trailer records (ISIZE, mod 2^32)."""
    if not gz:
        return os.fstat(raw.fileno()).st_size
    pos = raw.tell()
    raw.seek(-4, os.SEEK_END)
    isize = struct.unpack("<I", raw.read(4))[0]
    raw.seek(pos)
    return isize


def _read_idx(root: str, sources: list[str]) -> dict:
    for px, py in ((sources[0], sources[1]), (sources[2], sources[3])):  # before inflating any images
        nx, ny = _idx_header(px, 3)[0], _idx_header(py, 1)[0]
        if nx != ny:
            raise InputError(f"{px}: {nx} images but {ny} labels ({_IDX_LAYOUT})")
    xtr, ytr, xte, yte = (_idx_array(p, 3 if i % 2 == 0 else 1) for i, p in enumerate(sources))
    return {"x_train": xtr[:, None], "y_train": _labels(ytr, 10, sources[1], _IDX_LAYOUT),
            "x_test": xte[:, None], "y_test": _labels(yte, 10, sources[3], _IDX_LAYOUT), "classes": 10}


# ----------------------------------------------------------------------------- CIFAR-10

_CIFAR_LAYOUT = "expected the CIFAR-10 python version: data_batch_1..5, test_batch"
_CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def _cifar_dir(root: str) -> str:
    if os.path.basename(root) == "cifar-10-batches-py" or any(
            os.path.exists(os.path.join(root, f)) for f in _CIFAR_FILES):
        return root
    return os.path.join(root, "cifar-10-batches-py")


def _cifar_sources(root: str) -> list[str]:
    d = _cifar_dir(root)
    return _require([os.path.join(d, f) for f in _CIFAR_FILES], _CIFAR_LAYOUT)


def _latin1_encode(s: str, encoding: str = "latin1") -> bytes:
    """``_codecs.encode`` as protocol-2 pickles of bytes use it, and nothing else."""
    if not isinstance(s, str) or encoding.lower().replace("-", "") != "latin1":
        raise pickle.UnpicklingError("refused _codecs.encode other than str -> latin1")
    return s.encode("latin1")


_reconstruct = np.empty(0).__reduce__()[0]  # numpy's array-unpickling helper, whatever its module
_SAFE_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1_encode,
}


def restricted_load(data: bytes) -> object:
    """Unpickle ``data`` (protocol <= 5, Python 2 strings as bytes) without running code."""
    return safepickle.load(data, _SAFE_GLOBALS, encoding="bytes")


def _cifar_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    data = _read_bytes(path, _CIFAR_LAYOUT, MAX_PICKLE_BYTES)
    try:
        obj = restricted_load(data)
    except pickle.UnpicklingError as e:
        msg = str(e) if str(e).startswith("refused") else "truncated or corrupt pickle"
        raise InputError(f"{path}: {msg} ({_CIFAR_LAYOUT})") from None
    except Exception:  # EOFError, ValueError, ... from a damaged stream
        raise InputError(f"{path}: truncated or corrupt pickle ({_CIFAR_LAYOUT})") from None
    if isinstance(obj, dict):
        obj = {k.decode("latin1") if isinstance(k, bytes) else k: v for k, v in obj.items()}
    x = obj.get("data") if isinstance(obj, dict) else None
    y = obj.get("labels") if isinstance(obj, dict) else None
    if not (isinstance(x, np.ndarray) and x.dtype == np.uint8 and x.ndim == 2 and x.shape[1] == 3072
            and isinstance(y, (list, np.ndarray)) and len(y) == len(x)):
        raise InputError(f"{path}: malformed batch: needs 'data' uint8 (n, 3072) and n 'labels' ({_CIFAR_LAYOUT})")
    try:
        labels = np.asarray(y, dtype=np.int64)
    except (TypeError, ValueError):
        raise InputError(f"{path}: malformed batch: 'labels' are not integers ({_CIFAR_LAYOUT})") from None
    return x.reshape(-1, 3, 32, 32), _labels(labels, 10, path, _CIFAR_LAYOUT)


def _read_cifar(root: str, sources: list[str]) -> dict:
    batches = [_cifar_batch(p) for p in sources]
    train = batches[:5]
    return {"x_train": np.concatenate([b[0] for b in train]), "y_train": np.concatenate([b[1] for b in train]),
            "x_test": batches[5][0], "y_test": batches[5][1], "classes": 10}


# ----------------------------------------------------------------------------- SVHN

_SVHN_LAYOUT = "expected SVHN format 2: train_32x32.mat, test_32x32.mat (MATLAB v5)"


def _svhn_sources(root: str) -> list[str]:
    return _require([os.path.join(root, "train_32x32.mat"), os.path.join(root, "test_32x32.mat")], _SVHN_LAYOUT)


def _svhn_split(path: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        import scipy.io
    except ImportError:
        raise InputError("task.dataset: svhn needs scipy: pip install 'fedmpi[data]'") from None
    try:
        with open_input(path, f"dataset file ({_SVHN_LAYOUT})") as fh:
            mat = scipy.io.loadmat(fh, variable_names=["X", "y"])
    except InputError:
        raise
    except Exception as e:  # MatReadError, ValueError, NotImplementedError (v7.3), OSError, ...
        raise InputError(f"{path}: unreadable .mat file ({e.__class__.__name__}; {_SVHN_LAYOUT})") from None
    x, y = mat.get("X"), mat.get("y")
    if not (isinstance(x, np.ndarray) and x.ndim == 4 and x.shape[2] == 3 and isinstance(y, np.ndarray)
            and y.size == x.shape[3]):
        raise InputError(f"{path}: malformed: needs X (32, 32, 3, N) and y (N, 1) ({_SVHN_LAYOUT})")
    y = np.asarray(y).astype(np.int64).ravel()
    y[y == 10] = 0  # SVHN labels digit 0 as 10
    return np.ascontiguousarray(x.transpose(3, 2, 0, 1).astype(np.uint8)), _labels(y, 10, path, _SVHN_LAYOUT)


def _read_svhn(root: str, sources: list[str]) -> dict:
    (xtr, ytr), (xte, yte) = (_svhn_split(p) for p in sources)
    return {"x_train": xtr, "y_train": ytr, "x_test": xte, "y_test": yte, "classes": 10}


# ----------------------------------------------------------------------------- CINIC-10

_CINIC_LAYOUT = "expected CINIC-10 image folders train/<class>/*.png, test/<class>/*.png"


def _cinic_classes(root: str, split: str = "train") -> list[str]:
    d = os.path.join(root, split)
    if not os.path.isdir(d):
        raise DatasetMissing(f"{d}: missing ({_CINIC_LAYOUT})")
    return sorted(e.name for e in os.scandir(d) if e.is_dir())


def _cinic_sources(root: str) -> list[str]:
    classes = _cinic_classes(root)
    if not classes:
        raise DatasetMissing(f"{os.path.join(root, 'train')}: no class folders ({_CINIC_LAYOUT})")
    if _cinic_classes(root, "test") != classes:
        raise InputError(f"{os.path.join(root, 'test')}: class folders differ from train/ ({_CINIC_LAYOUT})")
    out = []
    for split in ("train", "test"):
        for c in classes:
            d = os.path.join(root, split, c)
            files = sorted(e.path for e in os.scandir(d) if e.is_file() and e.name.lower().endswith(".png"))
            if not files:
                raise DatasetMissing(f"{d}: no .png images ({_CINIC_LAYOUT})")
            out += files
    return out


def _read_cinic(root: str, sources: list[str]) -> dict:
    try:
        from PIL import Image
    except ImportError:
        raise InputError("task.dataset: cinic10 needs Pillow: pip install 'fedmpi[data]'") from None

    def decode(path: str) -> np.ndarray:
        try:
            with open_input(path, f"image ({_CINIC_LAYOUT})") as fh, Image.open(fh) as im:
                return np.asarray(im.convert("RGB"), dtype=np.uint8)
        except Exception as e:  # UnidentifiedImageError, OSError (truncated), ...
            raise InputError(f"{path}: unreadable image ({e.__class__.__name__}; {_CINIC_LAYOUT})") from None

    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        images = list(pool.map(decode, sources, chunksize=256))
    shape = images[0].shape
    for p, im in zip(sources, images):
        if im.shape != shape:
            raise InputError(f"{p}: image is {im.shape[1]}x{im.shape[0]}, others {shape[1]}x{shape[0]} "
                             f"({_CINIC_LAYOUT})")
    x = np.stack(images).transpose(0, 3, 1, 2)
    classes = _cinic_classes(root)
    index = {c: i for i, c in enumerate(classes)}
    rel = [os.path.relpath(p, root).split(os.sep) for p in sources]
    y = np.array([index[r[1]] for r in rel], dtype=np.int64)
    train = np.array([r[0] == "train" for r in rel])
    return {"x_train": np.ascontiguousarray(x[train]), "y_train": y[train],
            "x_test": np.ascontiguousarray(x[~train]), "y_test": y[~train], "classes": len(classes)}


# ----------------------------------------------------------------------------- registry

FORMATS: dict[str, _Format] = {
    "fmnist": _Format(_IDX_LAYOUT, _idx_sources, _read_idx, (0.2860,), (0.3530,), "/usr/share/datasets/fashion-mnist"),
    "mnist": _Format(_IDX_LAYOUT, _idx_sources, _read_idx, (0.1307,), (0.3081,), "/usr/share/datasets/mnist"),
    "cifar10": _Format(_CIFAR_LAYOUT, _cifar_sources, _read_cifar,
                       (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010), "cifar10"),
    "svhn": _Format(_SVHN_LAYOUT, _svhn_sources, _read_svhn,
                    (0.4377, 0.4438, 0.4728), (0.1980, 0.2010, 0.1970), "svhn"),
    "cinic10": _Format(_CINIC_LAYOUT, _cinic_sources, _read_cinic,
                       (0.4789, 0.4723, 0.4305), (0.2421, 0.2383, 0.2587), "cinic10"),
}
