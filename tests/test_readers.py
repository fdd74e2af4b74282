"""Dataset readers: tiny files in each real format, the cache, and one-line errors."""

from __future__ import annotations

import gzip
import os
import pickle
import struct
import sys

import numpy as np
import pytest

from fedmpi.data import readers
from fedmpi.data.readers import DatasetMissing, load
from fedmpi.errors import InputError

FMNIST_ROOT = "/usr/share/datasets/fashion-mnist"


# ----------------------------------------------------------------------------- writers

def idx_bytes(arr: np.ndarray) -> bytes:
    arr = np.asarray(arr, dtype=np.uint8)
    return bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()


def write_idx(root, rng, n_train=12, n_test=5, gz=True, hw=(28, 28)) -> dict:
    """IDX files as Debian ships them (gz) or raw; returns the arrays written."""
    os.makedirs(root, exist_ok=True)
    data = {"train-images-idx3-ubyte": rng.integers(0, 256, (n_train, *hw), dtype=np.uint8),
            "train-labels-idx1-ubyte": rng.integers(0, 10, n_train).astype(np.uint8),
            "t10k-images-idx3-ubyte": rng.integers(0, 256, (n_test, *hw), dtype=np.uint8),
            "t10k-labels-idx1-ubyte": rng.integers(0, 10, n_test).astype(np.uint8)}
    for name, arr in data.items():
        raw = idx_bytes(arr)
        with open(os.path.join(root, name + (".gz" if gz else "")), "wb") as fh:
            fh.write(gzip.compress(raw) if gz else raw)
    return data


def write_cifar(folder, rng, n=4) -> dict:
    """CIFAR-10 python batches: pickled dicts with bytes keys, protocol 2 like the originals."""
    os.makedirs(folder, exist_ok=True)
    out = {}
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]:
        batch = {b"batch_label": name.encode(), b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
                 b"labels": [int(v) for v in rng.integers(0, 10, n)], b"filenames": [b"x.png"] * n}
        with open(os.path.join(folder, name), "wb") as fh:
            pickle.dump(batch, fh, protocol=2)
        out[name] = batch
    return out


def one_line(e: pytest.ExceptionInfo, path) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    assert msg.startswith(str(path)), msg
    return msg


@pytest.fixture
def rng():
    return np.random.default_rng(0)


@pytest.fixture
def cache(tmp_path):
    return str(tmp_path / "cache")


# ----------------------------------------------------------------------------- IDX

@pytest.mark.parametrize("gz", [True, False])
def test_idx_gzip_and_raw(tmp_path, rng, cache, gz):
    src = write_idx(tmp_path / "fm", rng, gz=gz)
    d = load("fmnist", str(tmp_path / "fm"), cache)
    assert d.x_train.shape == (12, 1, 28, 28) and d.x_train.dtype == np.uint8
    assert d.x_test.shape == (5, 1, 28, 28) and d.y_test.dtype == np.int64 and d.y_train.dtype == np.int64
    np.testing.assert_array_equal(d.x_train[:, 0], src["train-images-idx3-ubyte"])
    np.testing.assert_array_equal(d.y_test, src["t10k-labels-idx1-ubyte"])
    assert d.classes == 10 and d.mean == (0.2860,) and d.std == (0.3530,)
    assert load("mnist", str(tmp_path / "fm"), cache).mean == (0.1307,)


def test_cache_reused_invalidated_and_rebuilt(tmp_path, rng, cache, monkeypatch):
    root = tmp_path / "fm"
    write_idx(root, rng)
    first = load("fmnist", str(root), cache)
    files = os.listdir(cache)
    assert len(files) == 1 and files[0].endswith(".npz")  # no temp files left behind

    def boom(*a, **k):
        raise AssertionError("sources re-read")

    monkeypatch.setattr(readers, "_idx_array", boom)
    again = load("fmnist", str(root), cache)
    np.testing.assert_array_equal(again.x_train, first.x_train)
    monkeypatch.undo()

    new = write_idx(root, np.random.default_rng(1), n_train=7)  # changed sources -> rebuilt
    d = load("fmnist", str(root), cache)
    assert d.x_train.shape[0] == 7
    np.testing.assert_array_equal(d.y_train, new["train-labels-idx1-ubyte"])

    cache_file = os.path.join(cache, os.listdir(cache)[0])
    with open(cache_file, "wb") as fh:
        fh.write(b"PK\x03\x04 not really a zip")
    assert load("fmnist", str(root), cache).x_train.shape[0] == 7  # corrupt cache silently rebuilt


def test_idx_missing_file_and_folder(tmp_path, rng, cache):
    root = tmp_path / "fm"
    write_idx(root, rng)
    os.remove(root / "t10k-labels-idx1-ubyte.gz")
    with pytest.raises(DatasetMissing) as e:
        load("fmnist", str(root), cache)
    assert "t10k-labels-idx1-ubyte" in one_line(e, root / "t10k-labels-idx1-ubyte")
    with pytest.raises(DatasetMissing) as e:
        load("fmnist", str(tmp_path / "nowhere"), cache)
    assert "missing" in one_line(e, tmp_path / "nowhere")


@pytest.mark.parametrize("damage", ["truncate_gz", "truncate_raw", "bad_magic", "not_gzip_content"])
def test_idx_damaged(tmp_path, rng, cache, damage):
    root = tmp_path / "fm"
    write_idx(root, rng, gz=damage != "truncate_raw")
    name = "train-images-idx3-ubyte" + ("" if damage == "truncate_raw" else ".gz")
    path = root / name
    blob = path.read_bytes()
    if damage in ("truncate_gz", "truncate_raw"):
        path.write_bytes(blob[: len(blob) // 2])
    elif damage == "bad_magic":
        path.write_bytes(gzip.compress(b"\x00\x00\x0d\x03" + gzip.decompress(blob)[4:]))
    else:
        path.write_bytes(b"\x1f\x8b" + b"garbage" * 10)
    with pytest.raises(InputError) as e:
        load("fmnist", str(root), cache)
    one_line(e, path)


def test_idx_count_mismatch(tmp_path, rng, cache):
    root = tmp_path / "fm"
    write_idx(root, rng)
    (root / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(idx_bytes(np.zeros(3))))
    with pytest.raises(InputError) as e:
        load("fmnist", str(root), cache)
    assert "labels" in one_line(e, root / "train-images-idx3-ubyte.gz")


@pytest.mark.skipif(not os.path.isdir(FMNIST_ROOT), reason="Debian's Fashion-MNIST not installed")
def test_real_debian_fmnist(cache):
    d = load("fmnist", None, cache)
    assert d.x_train.shape == (60000, 1, 28, 28) and d.x_test.shape == (10000, 1, 28, 28)
    assert d.classes == 10 and set(np.unique(d.y_train)) == set(range(10))
    assert abs(d.x_train.mean() / 255 - d.mean[0]) < 0.01 and abs(d.x_train.std() / 255 - d.std[0]) < 0.01


# ----------------------------------------------------------------------------- CIFAR-10

@pytest.mark.parametrize("point_at_batches", [False, True])
def test_cifar(tmp_path, rng, cache, point_at_batches):
    folder = tmp_path / "c10" / "cifar-10-batches-py"
    src = write_cifar(folder, rng)
    d = load("cifar10", str(folder if point_at_batches else tmp_path / "c10"), cache)
    assert d.x_train.shape == (20, 3, 32, 32) and d.x_test.shape == (4, 3, 32, 32)
    assert d.x_train.dtype == np.uint8 and d.y_train.dtype == np.int64
    np.testing.assert_array_equal(d.x_train[4:8].reshape(4, 3072), src["data_batch_2"][b"data"])
    np.testing.assert_array_equal(d.y_test, src["test_batch"][b"labels"])
    # the first 1024 bytes of a row are the red plane
    np.testing.assert_array_equal(d.x_test[0, 0].ravel(), src["test_batch"][b"data"][0, :1024])
    assert d.mean == (0.4914, 0.4822, 0.4465) and d.std == (0.2023, 0.1994, 0.2010)


def test_cifar_missing_batch(tmp_path, rng, cache):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder, rng)
    os.remove(folder / "data_batch_3")
    with pytest.raises(InputError) as e:
        load("cifar10", str(tmp_path), cache)
    msg = one_line(e, folder / "data_batch_3")
    assert "missing" in msg and "data_batch_1..5, test_batch" in msg


def test_cifar_truncated_and_malformed(tmp_path, rng, cache):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder, rng)
    path = folder / "data_batch_2"
    path.write_bytes(path.read_bytes()[:300])
    with pytest.raises(InputError) as e:
        load("cifar10", str(folder), cache)
    one_line(e, path)
    path.write_bytes(pickle.dumps({b"data": np.zeros((2, 10), np.uint8), b"labels": [0, 1]}, protocol=2))
    with pytest.raises(InputError) as e:
        load("cifar10", str(folder), cache)
    assert "malformed" in one_line(e, path)


class _Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def test_restricted_unpickler_refuses_code(tmp_path, rng, cache):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder, rng)
    marker = tmp_path / "pwned"
    path = folder / "data_batch_1"
    path.write_bytes(pickle.dumps({b"data": _Evil(marker), b"labels": []}, protocol=2))
    with pytest.raises(InputError) as e:
        load("cifar10", str(folder), cache)
    assert "refused" in one_line(e, path)
    assert not marker.exists()
    for payload in (pickle.dumps(_Evil(marker), protocol=p) for p in (0, 2, 5)):
        with pytest.raises(pickle.UnpicklingError):
            readers.restricted_load(payload)
    def codec(name: bytes) -> bytes:  # _codecs.encode("a", name), as protocol 2 pickles bytes
        return b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00aX" + struct.pack("<I", len(name)) + name + b"\x86R."

    assert readers.restricted_load(codec(b"latin1")) == b"a"
    with pytest.raises(pickle.UnpicklingError, match="refused"):  # any other codec is refused
        readers.restricted_load(codec(b"rot13"))
    assert not marker.exists()


# ----------------------------------------------------------------------------- SVHN

def test_svhn(tmp_path, rng, cache):
    sio = pytest.importorskip("scipy.io")
    root = tmp_path / "svhn"
    root.mkdir()
    src = {}
    for split, n in (("train", 6), ("test", 3)):
        x = rng.integers(0, 256, (32, 32, 3, n), dtype=np.uint8)
        y = np.array([10, 1, 9, 10, 5, 2][:n], dtype=np.uint8)[:, None]
        sio.savemat(str(root / f"{split}_32x32.mat"), {"X": x, "y": y})
        src[split] = (x, y)
    d = load("svhn", str(root), cache)
    assert d.x_train.shape == (6, 3, 32, 32) and d.x_train.dtype == np.uint8 and d.y_train.dtype == np.int64
    np.testing.assert_array_equal(d.y_train, [0, 1, 9, 0, 5, 2])
    x = src["train"][0]
    assert d.x_train[4, 2, 7, 11] == x[7, 11, 2, 4]
    assert d.mean == (0.4377, 0.4438, 0.4728)

    (root / "test_32x32.mat").write_bytes(b"MATLAB 5.0 MAT-file garbage")
    with pytest.raises(InputError) as e:
        load("svhn", str(root), cache)
    one_line(e, root / "test_32x32.mat")
    os.remove(root / "test_32x32.mat")
    with pytest.raises(DatasetMissing) as e:
        load("svhn", str(root), cache)
    one_line(e, root / "test_32x32.mat")


def test_svhn_without_scipy(tmp_path, cache, monkeypatch):
    root = tmp_path / "svhn"
    root.mkdir()
    for split in ("train", "test"):
        (root / f"{split}_32x32.mat").write_bytes(b"x")
    monkeypatch.setitem(sys.modules, "scipy.io", None)
    with pytest.raises(InputError, match=r"^task\.dataset: svhn needs scipy: pip install 'fedmpi\[data\]'$"):
        load("svhn", str(root), cache)


# ----------------------------------------------------------------------------- CINIC-10

def write_cinic(root, rng, classes=("cat", "airplane", "dog"), per=2) -> None:
    Image = pytest.importorskip("PIL.Image")
    for split in ("train", "test", "valid"):
        for c in classes:
            os.makedirs(root / split / c)
            for j in range(per):
                arr = rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)
                im = Image.fromarray(arr[..., 0]) if j == 1 else Image.fromarray(arr)  # one grayscale each
                im.save(root / split / c / f"{split}_{c}_{j}.png")


def test_cinic(tmp_path, rng, cache):
    root = tmp_path / "cinic"
    write_cinic(root, rng)
    d = load("cinic10", str(root), cache)
    assert d.x_train.shape == (6, 3, 32, 32) and d.x_test.shape == (6, 3, 32, 32) and d.x_train.dtype == np.uint8
    assert d.classes == 3
    np.testing.assert_array_equal(d.y_train, [0, 0, 1, 1, 2, 2])  # sorted: airplane, cat, dog
    from PIL import Image
    ref = np.asarray(Image.open(root / "test" / "cat" / "test_cat_0.png"))
    np.testing.assert_array_equal(d.x_test[2], ref.transpose(2, 0, 1))
    gray = d.x_train[1]  # grayscale image broadcast to 3 equal channels
    assert (gray[0] == gray[1]).all() and (gray[1] == gray[2]).all()


def test_cinic_errors(tmp_path, rng, cache):
    root = tmp_path / "cinic"
    write_cinic(root, rng)
    bad = root / "train" / "dog" / "train_dog_0.png"
    bad.write_bytes(bad.read_bytes()[:40])
    with pytest.raises(InputError) as e:
        load("cinic10", str(root), cache)
    one_line(e, bad)
    os.rename(root / "test" / "dog", root / "test" / "horse")
    with pytest.raises(InputError) as e:
        load("cinic10", str(root), cache)
    one_line(e, root / "test")


def test_unknown_dataset_and_standard_root(monkeypatch):
    with pytest.raises(InputError, match=r"^task\.dataset:"):
        load("imagenet", None, None)
    assert readers.standard_root("fmnist") == FMNIST_ROOT
    monkeypatch.setenv("FEDMPI_DATA", "/data")
    assert readers.standard_root("cifar10") == "/data/cifar10"


# ----------------------------------------------------------------------------- size limits

def test_idx_header_dims_that_overflow_int64(tmp_path, rng, cache):
    """2^22 x 2^21 x 2^21 bytes wraps to 0 in int64: the empty body passed the size check and
    failed in reshape."""
    root = tmp_path / "fm"
    write_idx(root, rng)
    path = root / "train-images-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(bytes([0, 0, 8, 3]) + struct.pack(">3I", 2**22, 2**21, 2**21)))
    with pytest.raises(InputError) as e:
        load("fmnist", str(root), cache)
    assert "header announces" in one_line(e, path)


def test_gzip_bomb_is_refused_without_inflating_it(tmp_path, rng, cache):
    """A gzip bomb was refused only after decompressing all of it into memory (3 GB, 53 s)."""
    import tracemalloc
    import zlib

    root = tmp_path / "fm"
    write_idx(root, rng)
    path = root / "train-images-idx3-ubyte.gz"
    z = zlib.compressobj(1, zlib.DEFLATED, 31)  # gzip container
    with open(path, "wb") as fh:
        fh.write(z.compress(idx_bytes(np.zeros((12, 28, 28)))))
        zeros = bytes(1 << 20)
        for _ in range(256):  # 256 MiB more than the header announces
            fh.write(z.compress(zeros))
        fh.write(z.flush())
    assert path.stat().st_size < 2 << 20
    tracemalloc.start()
    try:
        with pytest.raises(InputError) as e:
            load("fmnist", str(root), cache)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "holds more than the 9424 bytes its header announces (decompressed)" in one_line(e, path)
    assert peak < 32 << 20, f"{peak / 2**20:.0f} MiB held while refusing a gzip bomb"


def test_cifar_batch_size_limit(tmp_path, rng, cache, monkeypatch):
    folder = tmp_path / "cifar-10-batches-py"
    write_cifar(folder, rng)
    monkeypatch.setattr(readers, "MAX_PICKLE_BYTES", 1000)
    with pytest.raises(InputError) as e:
        load("cifar10", str(folder), cache)
    assert "holds more than the 1000 bytes allowed" in one_line(e, folder / "data_batch_1")


def test_train_and_test_images_of_different_shapes(tmp_path, rng, cache):
    """They failed only in the first evaluation."""
    root = tmp_path / "fm"
    write_idx(root, rng)
    (root / "t10k-images-idx3-ubyte.gz").write_bytes(gzip.compress(idx_bytes(np.zeros((5, 32, 32)))))
    with pytest.raises(InputError) as e:
        load("fmnist", str(root), cache)
    assert "test images are 1x32x32, training images 1x28x28" in one_line(e, root)
