"""Datasets beyond fedmpi-made classification splits: regression (classes 0 -> MSE), the
dataset's own client ids (partition.kind natural), LEAF's JSON layout, on files written here."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest
import torch

import fault_plugin
from conftest import cli, fedmpi, synthetic_config, write_config
from fedmpi import config
from fedmpi.build import build_task
from fedmpi.data.arrays import DataArrays
from fedmpi.data.datasets import register_dataset
from fedmpi.data.partition import natural_parts, natural_test_parts
from fedmpi.errors import InputError
from fedmpi.models.losses import mse
from fedmpi.registry import DATASETS
from fedmpi.runner import Runner
from fedmpi.runtime import World

SIZES = [30, 20, 10, 25]
W = np.array([1.0, -2.0, 0.5])


def _leaf(path, sizes, regression: bool, seed: int, first: int = 0) -> str:
    """A LEAF split of users w{first}, w{first + 1}, ...: user u's labels are {2(u % 2), 2(u % 2) + 1}
    (or y = W x + u)."""
    r = np.random.default_rng(seed)
    doc = {"users": [], "num_samples": [], "user_data": {}}
    for u, n in enumerate(sizes, start=first):
        x = r.normal(size=(n, 3))
        y = (x @ W + u).tolist() if regression else ((x[:, 0] > 0) + 2 * (u % 2)).astype(int).tolist()
        doc["users"].append(f"w{u}")
        doc["num_samples"].append(n)
        doc["user_data"][f"w{u}"] = {"x": x.tolist(), "y": y}
    path.write_text(json.dumps(doc))
    return str(path)


TEST_SIZES = [5, 7, 3, 6]


def _config(tmp_path, regression: bool, **over) -> dict:
    leaf = {"train": _leaf(tmp_path / "train.json", SIZES, regression, 0),
            "test": _leaf(tmp_path / "test.json", TEST_SIZES, regression, 1), "classes": 0 if regression else None}
    cfg = {"rounds": 10, "eval_every": 5, "output": str(tmp_path / "r.h5"), "availability": {"kind": "always"},
           "task": {"dataset": "leaf", "leaf": leaf, "clients": 4, "model": "logreg", "partition": {"kind": "natural"},
                    "cache_dir": str(tmp_path / "cache")},
           "train": {"local_steps": 5, "batch_size": 8, "lr": 0.05}, "runtime": {"progress": False}}
    for k, v in over.items():
        cfg["task"][k] = v
    return cfg


def test_natural_parts_follow_the_ids():
    ids = np.array([7, 3, 7, 9, 3, 3])
    assert [p.tolist() for p in natural_parts(ids, 2)] == [[1, 4, 5], [0, 2]]  # id 3, then id 7; 9 left out
    with pytest.raises(Exception, match="task.clients: 4 clients, but the dataset's natural partition has only 3"):
        natural_parts(ids, 4)


def test_leaf_users_are_the_clients(tmp_path):
    task = build_task(config.from_dict(_config(tmp_path, regression=False)), torch.device("cpu"))
    assert list(task.sizes) == SIZES and task.classes == 4
    for u in range(4):  # each client holds exactly its user's labels
        ys = set(task.train_y[task.order[task.offsets[u]:task.offsets[u + 1]]].tolist())
        assert ys <= {2 * (u % 2), 2 * (u % 2) + 1}
    three = build_task(config.from_dict(_config(tmp_path, regression=False, clients=3)), torch.device("cpu"))
    assert list(three.sizes) == SIZES[:3]


@pytest.mark.slow
def test_regression_trains_with_mse_and_matches_its_rederivation(tmp_path):
    out = tmp_path / "r.h5"
    cfg = write_config(tmp_path / "r.yaml", _config(tmp_path, regression=True))
    fedmpi(["run", cfg, "--quiet"])
    with h5py.File(out) as f:
        assert "test_acc" not in f["metrics"] and f.attrs["status"] == "completed"
        loss = f["metrics/test_loss"][:]
        assert loss[-1] < loss[0] / 2
        w = f["final/params"][:]  # logreg: weight (1, 3), then bias (1,)
        assert list(f["partition/samples"][:]) == SIZES
    test = json.load(open(tmp_path / "test.json"))["user_data"]
    x = np.concatenate([np.array(test[u]["x"]) for u in test])
    y = np.concatenate([np.array(test[u]["y"]) for u in test])
    assert loss[-1] == pytest.approx(np.mean((x @ w[:3] + w[3] - y) ** 2), rel=1e-4)
    out_t, y_t = torch.tensor([[1.0, 3.0]]), torch.tensor([[0.0, 1.0]])
    assert mse(out_t, y_t).item() == pytest.approx(2.5)


@pytest.mark.parametrize("change, needle", [
    ({"partition": {"kind": "dirichlet"}}, "task.partition.kind: dirichlet splits by class labels"),
    ({"leaf": {"train": "missing.json", "test": "missing.json", "classes": 0}},
     "no such file or folder (task.leaf.train, LEAF layout)"),
])
def test_regression_and_leaf_errors(tmp_path, change, needle):
    cfg = write_config(tmp_path / "bad.yaml", _config(tmp_path, regression=True, **change))
    p = cli(["run", cfg, "--quiet"])
    assert p.returncode == 2 and needle in p.stderr and len(p.stderr.strip().splitlines()) == 1


def test_natural_needs_client_ids_and_a_broken_file_is_named(tmp_path):
    cfg = write_config(tmp_path / "s.yaml", synthetic_config(task__partition__kind="natural"))
    p = cli(["run", cfg, "--quiet"])
    assert p.returncode == 2 and "natural needs a dataset that gives client ids" in p.stderr
    (tmp_path / "bad.json").write_text('{"users": ["a"], "user_data": {}}')
    c = _config(tmp_path, regression=False)
    c["task"]["leaf"]["train"] = str(tmp_path / "bad.json")
    p = cli(["run", write_config(tmp_path / "b.yaml", c), "--quiet"])
    assert p.returncode == 2 and "bad.json: not a LEAF json file" in p.stderr


@pytest.mark.slow
@pytest.mark.mpi
def test_natural_regression_same_bits_on_1_and_3_ranks(tmp_path):
    cfg = write_config(tmp_path / "r.yaml", _config(tmp_path, regression=True, partition={"kind": "natural",
                                                                                         "local_test": 0.2}))
    for ranks, out in ((0, "one.h5"), (3, "three.h5")):
        fedmpi(["run", cfg, "--quiet", "--out", str(tmp_path / out), "--set", "evaluation.clients.arrays=true"],
               ranks=ranks)
    with h5py.File(tmp_path / "one.h5") as a, h5py.File(tmp_path / "three.h5") as b:
        for k in ("final/params", "metrics/test_loss", "clients/loss"):
            np.testing.assert_array_equal(a[k][:], b[k][:])


def test_regression_logs_train_loss(tmp_path):
    """#38 item 6: with ``classes: 0`` and ``evaluation.train`` (the default) no train_loss was
    logged; it is the MSE of the model on the training samples (no train_acc: no classes)."""
    cfg = config.from_dict(_config(tmp_path, regression=True))
    out = str(tmp_path / "r.h5")
    Runner(cfg, World(), out, quiet=True).run()
    with h5py.File(out) as f:
        assert "train_acc" not in f["metrics"] and "test_acc" not in f["metrics"]
        train_loss, w = f["metrics/train_loss"][:], f["final/params"][:]
    train = json.load(open(tmp_path / "train.json"))["user_data"]
    x = np.concatenate([np.array(train[u]["x"]) for u in train])
    y = np.concatenate([np.array(train[u]["y"]) for u in train])
    assert train_loss[-1] == pytest.approx(np.mean((x @ w[:3] + w[3] - y) ** 2), rel=1e-4)
    assert train_loss[-1] < train_loss[0] / 2
    off = config.from_dict({**_config(tmp_path, regression=True), "evaluation": {"train": False}})
    Runner(off, World(), str(tmp_path / "off.h5"), quiet=True).run()
    with h5py.File(tmp_path / "off.h5") as f:
        assert "train_loss" not in f["metrics"]


@pytest.mark.parametrize("doc, needle", [
    ("[" * 100_000 + "]" * 100_000, r"train\.json: JSON nested 100000 levels deep, more than the 64 allowed$"),
    (json.dumps({"users": ["a", "b"], "num_samples": [2, 1],
                 "user_data": {"a": {"x": [[], []], "y": [0, 1]}, "b": {"x": [[]], "y": [1]}}}),
     r"^task\.leaf\.train: every sample must be a flat list of at least one number, got empty lists$"),
    (json.dumps({"users": ["a"], "num_samples": [2], "user_data": {"a": {"x": [[[1.0]], [[2.0]]], "y": [0, 1]}}}),
     r"^task\.leaf\.train: every sample must be a flat list of at least one number, got nested 2 levels deep$"),
    ('{"users": ["a"], "users": ["b"]}', r"train\.json: duplicate key 'users'$"),
], ids=["deep", "no-features", "nested-x", "duplicate-key"])
def test_hostile_leaf_files_are_one_line(tmp_path, doc, needle):
    """#38 item 14: a 10^5-deep JSON raised RecursionError, samples without features
    ZeroDivisionError; the reader now counts the nesting before parsing and wants a feature."""
    cfg = _config(tmp_path, regression=False)
    (tmp_path / "train.json").write_text(doc)
    with pytest.raises(InputError, match=needle):
        build_task(config.from_dict(cfg), torch.device("cpu"))


# ----------------------------------------------------------------------------- each user's own test samples

PER_USER = {"kind": "natural", "local_test": "dataset"}
FAIR = ["mean", "weighted", "worst", "best", "var", "min", "p10", "p90"]


def test_natural_test_parts_follow_the_training_ids():
    train, test = np.array([7, 3, 7, 9, 3, -2]), np.array([3, 5, -2, 9, 7, 3, 9])
    assert [p.tolist() for p in natural_test_parts(train, test, 3)] == [[2], [0, 5], [4]]  # ids -2, 3, 7
    assert [p.tolist() for p in natural_test_parts(train, test, 4)][3] == [3, 6]  # id 9; id 5 is no client's


def test_each_users_test_samples_are_its_local_test_split(tmp_path):
    cfg = config.from_dict(_config(tmp_path, regression=False, partition=PER_USER))
    for _ in range(2):  # parsed, then from the cache
        task = build_task(cfg, torch.device("cpu"))
        assert task.local_test_source == "test" and list(np.diff(task.local_test_offsets)) == TEST_SIZES
        assert list(task.sizes) == SIZES  # nothing held out of training
        assert task.test_x.shape[0] == sum(TEST_SIZES)  # and the global test set is all of them
        for u in range(4):
            ys = task.test_y[task.local_test_order[task.local_test_offsets[u]:task.local_test_offsets[u + 1]]]
            assert set(ys.tolist()) <= {2 * (u % 2), 2 * (u % 2) + 1}
    three = build_task(config.from_dict(_config(tmp_path, regression=False, clients=3, partition=PER_USER)),
                       torch.device("cpu"))
    assert list(np.diff(three.local_test_offsets)) == TEST_SIZES[:3] and three.test_x.shape[0] == sum(TEST_SIZES)


def _per_user(tmp_path, params: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each user's test loss and accuracy under logreg ``params`` (weight (4, 3), then bias), in float64."""
    test = json.load(open(tmp_path / "test.json"))["user_data"]
    w, b = params[:12].reshape(4, 3).astype(np.float64), params[12:].astype(np.float64)
    loss, acc = [], []
    for u in range(4):
        x, y = np.array(test[f"w{u}"]["x"]), np.array(test[f"w{u}"]["y"])
        z = x @ w.T + b
        logp = z - z.max(1, keepdims=True) - np.log(np.exp(z - z.max(1, keepdims=True)).sum(1, keepdims=True))
        loss.append(-logp[np.arange(len(y)), y].mean())
        acc.append((z.argmax(1) == y).mean())
    return np.array(loss), np.array(acc)


@pytest.mark.slow
def test_per_user_test_metrics_and_fairness_match_their_rederivation(tmp_path):
    c = _config(tmp_path, regression=False, partition=PER_USER)
    c["evaluation"] = {"clients": {"arrays": True, "summaries": FAIR}}
    fedmpi(["run", write_config(tmp_path / "c.yaml", c), "--quiet"])
    with h5py.File(tmp_path / "r.h5") as f:
        loss, acc = _per_user(tmp_path, f["final/params"][:])
        assert f["clients/acc"].shape == (3, 4)  # rounds 0, 5, 10 x users
        np.testing.assert_allclose(f["clients/loss"][-1], loss, rtol=1e-5)
        np.testing.assert_array_equal(f["clients/acc"][-1], acc)
        m = {k: f[f"metrics/client_acc_{k}"][-1] for k in FAIR}
        n = np.array(TEST_SIZES)
        np.testing.assert_array_equal(f["partition/local_test_samples"][:], n)  # the weights of 'weighted'
        assert m["weighted"] == pytest.approx(f["metrics/test_acc"][-1])  # every test sample is some user's
        assert m["weighted"] == pytest.approx((acc * n).sum() / n.sum()) and m["mean"] == pytest.approx(acc.mean())
        assert m["var"] == pytest.approx(np.var(acc)) and m["min"] == acc.min()
        assert m["worst"] == acc.min() and m["best"] == acc.max()  # worst 10% of 4 users: one user
        assert f["metrics/client_loss_weighted"][-1] == pytest.approx(f["metrics/test_loss"][-1], rel=1e-6)


def test_per_user_test_data_is_refused_where_it_means_nothing(tmp_path):
    bad = _config(tmp_path, False, partition={"kind": "iid", "local_test": "dataset"})
    p = cli(["run", write_config(tmp_path / "bad.yaml", bad), "--quiet"])
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "task.partition.local_test: dataset (each client's own test samples) needs task.partition.kind: " \
           "natural, got iid" in p.stderr
    with pytest.raises(InputError, match="task.partition.local_test: must be a number or one of dataset, got 'all'"):
        config.from_dict(_config(tmp_path, False, partition={"kind": "natural", "local_test": "all"}))
    c = _config(tmp_path, False, partition=PER_USER)  # LEAF split by user: no test user trains
    c["task"]["leaf"]["test"] = _leaf(tmp_path / "others.json", [4, 4], False, 2, first=10)
    with pytest.raises(InputError, match="no test sample of 'leaf' belongs to one of the 4 clients"):
        build_task(config.from_dict(c), torch.device("cpu"))

    @register_dataset("ids_of_training_only")
    def ids_of_training_only(cfg):
        x = np.zeros((6, 2), np.float32)
        return DataArrays(x, np.arange(6) % 2, x, np.arange(6) % 2, 2, client_train=np.arange(6) // 2)

    try:
        cfg = config.from_dict({"task": {"dataset": "ids_of_training_only", "clients": 3, "partition": PER_USER}})
        with pytest.raises(InputError, match="'ids_of_training_only' gives none: hold out a fraction"):
            build_task(cfg, torch.device("cpu"))
    finally:
        DATASETS._entries.pop("ids_of_training_only", None)


def test_per_user_test_metrics_survive_a_resume_bit_for_bit(tmp_path):
    c = _config(tmp_path, regression=False, partition=PER_USER)
    c.update(runtime={"checkpoint_every": 2, "progress": False}, eval_every=2,
             evaluation={"clients": {"arrays": True, "summaries": FAIR}})
    cfg = config.from_dict(c)
    Runner(cfg, World(), str(tmp_path / "straight.h5"), quiet=True).run()
    with pytest.raises(RuntimeError, match="injected"):
        Runner(cfg, World(), str(tmp_path / "cut.h5"), quiet=True, callbacks=[fault_plugin.inject("0:5:raise")]).run()
    Runner(cfg, World(), str(tmp_path / "cut.h5"), quiet=True, resume=True).run()
    with h5py.File(tmp_path / "straight.h5") as a, h5py.File(tmp_path / "cut.h5") as b:
        for k in ("clients/acc", "clients/loss", "metrics/client_acc_var", "final/params"):
            np.testing.assert_array_equal(a[k][:], b[k][:])


@pytest.mark.slow
@pytest.mark.mpi
def test_per_user_test_metrics_same_bits_on_1_and_2_ranks(tmp_path):
    c = _config(tmp_path, regression=False, partition=PER_USER)
    c["evaluation"] = {"clients": {"arrays": True, "summaries": FAIR}}
    cfg = write_config(tmp_path / "c.yaml", c)
    for ranks, out in ((0, "one.h5"), (2, "two.h5")):
        fedmpi(["run", cfg, "--quiet", "--out", str(tmp_path / out)], ranks=ranks)
    with h5py.File(tmp_path / "one.h5") as a, h5py.File(tmp_path / "two.h5") as b:
        assert a["clients/acc"].shape == (3, 4)
        for k in ("final/params", "clients/acc", "clients/loss", *(f"metrics/client_acc_{s}" for s in FAIR)):
            np.testing.assert_array_equal(a[k][:], b[k][:])
