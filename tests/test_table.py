"""fedmpi table / results.load / export on result files written directly (no training)."""

from __future__ import annotations

import csv
import io

import numpy as np
import pytest

from fake_results import fake_result
from fedmpi import results
from fedmpi.cli import main
from fedmpi.errors import InputError
from fedmpi.results import table

ROUNDS = [0, 10, 20, 30]


def _runs(tmp_path, accs: dict[tuple[str, int], list[float]], **over) -> list[str]:
    """One file per (algorithm, seed) with the given test_acc curve."""
    paths = []
    for (algo, seed), acc in accs.items():
        p = tmp_path / f"{algo}-s{seed}.h5"
        paths.append(fake_result(p, {"round": ROUNDS, "test_acc": acc, "test_loss": [1.0 - a for a in acc]},
                                 seed=seed, algorithm__name=algo, **over))
    return paths


def _table(capsys, args) -> str:
    assert main(["table", *args]) == 0
    return capsys.readouterr().out


def test_mean_std_over_seeds_of_the_last_k(tmp_path, capsys):
    rng = np.random.default_rng(0)
    accs = {(a, s): list(rng.uniform(0, 1, 4)) for a in ("fedavg_active", "mifa") for s in (0, 1, 2)}
    _runs(tmp_path, accs)
    out = _table(capsys, [str(tmp_path), "--rows", "algorithm.name", "--last", "2", "--format", "csv"])
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [r["algorithm.name"] for r in rows] == ["fedavg_active", "mifa"]
    for r in rows:
        per_seed = [np.mean(accs[(r["algorithm.name"], s)][-2:]) for s in (0, 1, 2)]
        assert float(r["test_acc (last 2) mean"]) == pytest.approx(np.mean(per_seed), abs=1e-12)
        assert float(r["test_acc (last 2) std"]) == pytest.approx(np.std(per_seed), abs=1e-12)
        assert r["test_acc (last 2) n"] == "3"


@pytest.mark.parametrize("how, expect", [
    ({"at": 25}, lambda a: a[2]),                 # value in force at round 25 = evaluation at 20
    ({"at": 30}, lambda a: a[3]),
    ({"best": "max"}, max),
    ({"best": "min"}, min),
    ({"window": [10, 20]}, lambda a: (a[1] + a[2]) / 2),
    ({}, lambda a: a[-1]),                        # default: the final evaluation
])
def test_reducers(tmp_path, how, expect):
    acc = [0.1, 0.7, 0.4, 0.6]
    r = results.load(_runs(tmp_path, {("mifa", 0): acc})[0])
    assert table.metric_spec({"metric": "test_acc", **how}, "t").value(r) == pytest.approx(expect(acc))


def test_markdown_latex_bold_and_scale(tmp_path, capsys):
    _runs(tmp_path, {("fedavg_active", 0): [0, 0, 0, 0.5], ("fedavg_active", 1): [0, 0, 0, 0.7],
                     ("mifa", 0): [0, 0, 0, 0.9]})
    sweep_like = ["--rows", "algorithm.name", "--scale", "100", "--digits", "1"]
    md = _table(capsys, [str(tmp_path), *sweep_like])
    assert "| fedavg_active | 60.0 +/- 10.0 |" in md
    assert "| mifa | 90.0 (n=1) |" in md  # fewer runs than the other rows: said so
    tex = _table(capsys, [str(tmp_path), *sweep_like, "--format", "latex"])
    assert r"$60.0 \pm 10.0$" in tex and r"algorithm.name & test\_acc" in tex and tex.startswith(r"\begin{tabular}")


def test_runs_of_different_experiments_are_not_averaged(tmp_path, capsys):
    _runs(tmp_path, {("mifa", 0): [0.1] * 4})
    fake_result(tmp_path / "other.h5", {"round": ROUNDS, "test_acc": [0.9] * 4}, seed=1, algorithm__name="mifa",
                train__lr=0.5)
    assert main(["table", str(tmp_path), "--rows", "algorithm.name"]) == 2
    err = capsys.readouterr().err
    assert "differ in train.lr" in err and len(err.strip().splitlines()) == 1
    out = _table(capsys, [str(tmp_path), "--rows", "algorithm.name,train.lr"])
    assert "| mifa | 0.1 | 0.1000 |" in out and "| mifa | 0.5 | 0.9000 |" in out


def test_same_seed_twice_is_refused(tmp_path, capsys):
    a = _runs(tmp_path, {("mifa", 0): [0.1] * 4})[0]
    b = fake_result(tmp_path / "copy.h5", {"round": ROUNDS, "test_acc": [0.2] * 4}, seed=0, algorithm__name="mifa")
    assert main(["table", a, b]) == 2 and "same experiment and seed" in capsys.readouterr().err


def test_unfinished_runs_left_out_unless_partial(tmp_path, capsys):
    _runs(tmp_path, {("mifa", 0): [0.1] * 4})
    fake_result(tmp_path / "run.h5", {"round": ROUNDS, "test_acc": [0.3] * 4}, status="running", seed=1,
                algorithm__name="mifa")
    assert main(["table", str(tmp_path), "--format", "csv"]) == 0
    captured = capsys.readouterr()
    assert "left out 1 runs" in captured.err
    assert list(csv.DictReader(io.StringIO(captured.out)))[0]["test_acc n"] == "1"
    rows = list(csv.DictReader(io.StringIO(_table(capsys, [str(tmp_path), "--format", "csv", "--partial"]))))
    assert rows[0]["test_acc n"] == "2"


@pytest.mark.parametrize("args, needle", [
    (["--rows", "nope.key"], "nope.key: not a config key"),
    (["--metric", "test_acc", "--at", "5", "--x", "sim_delay"], "has no metric 'sim_delay'"),
])
def test_table_bad_input(tmp_path, capsys, args, needle):
    _runs(tmp_path, {("mifa", 0): [0.1] * 4})
    assert main(["table", str(tmp_path), *args]) == 2
    assert needle in capsys.readouterr().err


def test_load_api(tmp_path):
    p = _runs(tmp_path, {("mifa", 3): [0.1, 0.2, 0.3, 0.4]})[0]
    r = results.load(p)
    assert r.status == "completed" and r.seed == 3 and r.rounds_done == 30
    assert r.metrics["round"].dtype == np.int64 and r.metrics["test_acc"].dtype == np.float64
    assert list(r.metrics["test_acc"]) == [0.1, 0.2, 0.3, 0.4]
    assert r.config["algorithm"]["name"] == "mifa" and r.get("algorithm.name") == "mifa"
    assert "seed" not in r.experiment() and "runtime.progress" not in r.experiment()
    with pytest.raises(InputError, match="no such result file"):
        results.load(str(tmp_path / "none.h5"))


def test_dataframe(tmp_path):
    pd = pytest.importorskip("pandas")
    paths = _runs(tmp_path, {("mifa", 0): [0.1] * 4, ("fedavg_active", 1): [0.2] * 4})
    df = results.dataframe(paths, keys=["algorithm.name", "seed"])
    assert isinstance(df, pd.DataFrame) and len(df) == 8
    assert list(df.columns[:3]) == ["file", "algorithm.name", "seed"]
    means = df.groupby("algorithm.name")["test_acc"].mean().to_dict()
    assert means == pytest.approx({"mifa": 0.1, "fedavg_active": 0.2})


def test_export_csv(tmp_path, capsys):
    paths = _runs(tmp_path, {("mifa", 0): [0.1, 0.2, 0.3, 0.4], ("fedavg_active", 1): [0.5] * 4})
    assert main(["export", *paths, "--csv"]) == 0
    rows = list(csv.DictReader(open(paths[0][:-3] + ".csv")))
    assert [r["round"] for r in rows] == ["0", "10", "20", "30"] and float(rows[3]["test_acc"]) == 0.4
    capsys.readouterr()
    assert main(["export", *paths, "--out", "-"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert len(rows) == 8 and {r["algorithm.name"] for r in rows} == {"mifa", "fedavg_active"}
    assert {r["seed"] for r in rows} == {"0", "1"}
    assert main(["export", paths[0], "--out", paths[0]]) == 2


def test_result_files_from_before_a_key_moved_group_with_new_ones(tmp_path):
    """A file written when eta_g was train.global_lr reads as algorithm.global_lr: the same
    experiment as a new file's (fedmpi table and plot group by these keys)."""
    import h5py
    import yaml

    from fedmpi.results import reader

    new = fake_result(tmp_path / "new.h5", {"round": [0, 6], "test_acc": [0.1, 0.5]})
    old = fake_result(tmp_path / "old.h5", {"round": [0, 6], "test_acc": [0.1, 0.6]})
    with h5py.File(old, "a") as f:
        stored = yaml.safe_load(f.attrs["config"])
        stored["train"]["global_lr"] = stored["algorithm"].pop("global_lr")
        f.attrs["config"] = yaml.safe_dump(stored)
    a, b = reader.load(new), reader.load(old)
    assert "global_lr" not in b.config["train"] and b.get("algorithm.global_lr") == a.get("algorithm.global_lr")
    assert a.experiment() == b.experiment()
