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
    assert r"$60.0 \pm 10.0$" in tex and r"algorithm & test\_acc" in tex and tex.startswith(r"\begin{tabular}")


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


# ----------------------------------------------------------------------------- hostile inputs (#38)

def test_privacy_settings_are_result_defining(tmp_path, capsys):
    """#38.2: noise 0.1 and 50 were one cell '0.5300 +/- 0.1633'. Every key outside the run-only
    ones defines a result, privacy: among them."""
    pytest.importorskip("dp_accounting", reason="a privacy config needs the [privacy] extra")
    dp = {"mechanism": "gaussian", "clip": 1.0}
    for seed, sigma, acc in ((0, 0.1, 0.7), (1, 0.1, 0.72), (0, 50.0, 0.36), (1, 50.0, 0.34)):
        fake_result(tmp_path / f"s{sigma}-{seed}.h5", {"round": ROUNDS, "test_acc": [0.1, 0.2, 0.3, acc]},
                    seed=seed, privacy={**dp, "noise_multiplier": sigma})
    rows = list(csv.DictReader(io.StringIO(_table(capsys, [str(tmp_path), "--format", "csv"]))))
    assert [(r["privacy.noise_multiplier"], r["test_acc n"]) for r in rows] == [("0.1", "2"), ("50.0", "2")]
    assert float(rows[0]["test_acc mean"]) == pytest.approx(0.71)
    assert main(["table", str(tmp_path), "--rows", "algorithm.name"]) == 2
    err = capsys.readouterr().err
    assert "differ in privacy.noise_multiplier" in err and len(err.strip().splitlines()) == 1
    from fedmpi.results import plot

    curves = plot.curves_of(plot.gather_runs([str(tmp_path)]), "test_acc", "round")
    assert sorted(c.runs for c in curves) == [2, 2]


def test_result_defining_keys_follow_the_config_schema():
    """Every key of the config schema is result-defining unless it is run-only (name, length,
    schedule, where and how it runs, switches that add metrics): a section added later, privacy:
    today, cannot be merged by accident. The run-only keys exist in the schema (a renamed one
    would count as result-defining, the safe side), and every key a checkpoint depends on
    (the resume digest) is result-defining."""
    import dataclasses

    from fedmpi import config
    from fedmpi.results import reader

    pytest.importorskip("dp_accounting", reason="a privacy config needs the [privacy] extra")
    top = {f.name for f in dataclasses.fields(config.Config)}
    schema = [row.split("`")[1] for _, row in config.reference()]
    for run_key in reader.RUN_KEYS:
        assert run_key in top or run_key in schema, run_key
    private = {"privacy": {"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 1.0},
               "algorithm": {"name": "fedavg_active"}}
    for cfg in (config.from_dict(private), config.from_dict({"algorithm": {"name": "dspodfl"}})):
        for key in cfg.resume_keys():
            assert key == "seed" or reader.is_result_key(key), key
    assert [k for k in schema if k.startswith("privacy.") and not reader.is_result_key(k)] == []
    assert not reader.is_result_key("runtime.label") and not reader.is_result_key("seed")
    assert reader.is_result_key("evaluation.clients.worst")  # changes client_acc_worst


def test_scale_leaves_rounds_to_counts_alone(tmp_path, capsys):
    """#38.3: --scale 100 showed 4.7 rounds as 466.7."""
    _runs(tmp_path, {("mifa", 0): [0.1, 0.5, 0.9, 0.9], ("mifa", 1): [0.1, 0.2, 0.5, 0.9]})
    out = _table(capsys, [str(tmp_path), "--format", "csv", "--scale", "100", "--rounds-to", "test_acc=0.5",
                          "--metric", "test_acc"])
    row = next(csv.DictReader(io.StringIO(out)))
    assert float(row["test_acc mean"]) == pytest.approx(90.0)
    assert float(row["rounds to test_acc >= 0.5 mean"]) == pytest.approx(15.0)


def test_bad_goal_names_its_values(tmp_path):
    """#38.17: a bad goal: said 'must be max or min'."""
    with pytest.raises(InputError, match=r"t\.goal: must be at_least or at_most, got 'most'"):
        table.metric_spec({"metric": "test_acc", "rounds_to": 0.5, "goal": "most"}, "t")
    with pytest.raises(InputError, match=r"t\.best: must be max or min, got 'top'"):
        table.metric_spec({"metric": "test_acc", "best": "top"}, "t")


@pytest.mark.parametrize("command", ["table", "plot"])
def test_a_file_without_a_config_is_not_grouped(tmp_path, capsys, command):
    """#38.15: a file whose config is missing or unreadable was tabulated as an experiment of
    its own (or with any other such file)."""
    import h5py

    good = _runs(tmp_path, {("mifa", 0): [0.1] * 4})[0]
    bad = fake_result(tmp_path / "noconfig.h5", {"round": ROUNDS, "test_acc": [0.2] * 4}, seed=1)
    with h5py.File(bad, "a") as f:
        del f.attrs["config"]
    extra = ["--out", str(tmp_path / "f.png")] if command == "plot" else []
    assert main([command, good, bad, *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "noconfig.h5: has no readable config" in err[0], err


# ----------------------------------------------------------------------------- labels (#35.7)

def _labelled_sweep(tmp_path, labels: dict | None = None) -> str:
    """2 variants x 2 local-step counts x 2 seeds, cells written directly (no training)."""
    from conftest import synthetic_config, write_config
    from fedmpi import sweep as sweeps
    from fedmpi.results.hdf5 import ResultWriter, claim

    tmp_path.mkdir(parents=True, exist_ok=True)
    write_config(tmp_path / "base.yaml", synthetic_config())
    data = {"base": "base.yaml", "out": str(tmp_path / "out"),
            "variants": [{"label": "FedAvg", "algorithm.name": "fedavg_active"},
                         {"label": "FedSWE (k=100)", "algorithm.name": "fedswe", "algorithm.k": 100}],
            "grid": {"train.local_steps": [1, 5], "seed": [0, 1]}, **({"labels": labels} if labels else {})}
    path = write_config(tmp_path / "s.sweep.yaml", data)
    sw = sweeps.load(path)
    for cell in sw.cells:
        cfg = sw.config(cell)
        w = ResultWriter(cell.path, cfg.to_yaml(), cfg.seed, 1, ["test_acc"], cfg.task.clients, False,
                         claim_=claim(cell.path, cfg.resume_digest()))
        acc = 0.5 + 0.1 * (cfg.algorithm.name == "fedswe") + 0.01 * cfg.train.local_steps + 0.001 * cfg.seed
        w.append({"round": 0, "test_acc": 0.1}, 0)
        w.append({"round": 6, "test_acc": acc}, 6)
        w.finish("completed", np.zeros(3), 6)
    return path


def test_sweep_labels_name_keys_and_values_in_tables(tmp_path, capsys):
    """A sweep's labels: head the key columns and name values; without labels a key is named by
    its shortest distinct tail (train.local_steps -> local_steps); CSV keeps keys and values."""
    path = _labelled_sweep(tmp_path, {"variant": "method", "train.local_steps": {
        "name": "local steps", "values": {1: "one step"}}})
    md = _table(capsys, [path, "--cols", "train.local_steps"])
    lines = md.splitlines()
    assert lines[0] == "| method | test_acc [one step] | test_acc [local steps=5] |", lines[0]
    assert lines[2].startswith("| FedAvg | 0.5105 +/- 0.0005 | 0.5505 +/- 0.0005 |"), lines[2]
    assert lines[3].startswith("| FedSWE (k=100) | 0.6105"), lines[3]
    md = _table(capsys, [path])  # rows: the variant and the grid key that differs within it
    assert md.splitlines()[0] == "| method | local steps | test_acc |" and "| FedAvg | one step |" in md
    out = _table(capsys, [path, "--format", "csv"])
    assert out.splitlines()[0].startswith("variant,train.local_steps,") and "\nFedAvg,1," in out
    plain = _labelled_sweep(tmp_path / "plain")
    assert _table(capsys, [plain]).splitlines()[0] == "| variant | local_steps | test_acc |"


def test_bad_labels_are_one_line(tmp_path, capsys):
    path = _labelled_sweep(tmp_path)
    import yaml

    data = yaml.safe_load(open(path))
    for labels, needle in (({"train.local_steps": {"values": {3: "three"}}}, "labels.train.local_steps.values: 3 "
                                                                             "is not one of its values (1, 5)"),
                           ({"variant": {"values": {"fedavg": "x"}}}, "'fedavg' is not one of its values"),
                           ({"seed": {"values": {0: "a", 1: "a"}}}, "two values have one label"),
                           ({"seed": {"title": "s"}}, "labels.seed: must be a name or a mapping"),
                           ({"seed": ""}, "labels.seed.name: must be a non-empty text")):
        data["labels"] = labels
        open(path, "w").write(yaml.safe_dump(data))
        assert main(["table", path]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and needle in err[0], (needle, err)


def test_files_of_a_sweep_keep_their_variant_in_tables_and_exports(tmp_path, capsys):
    """Some of a sweep's files, read alone: the table's rows and the export's variant column
    name the variants (each cell's file records runtime.label)."""
    import glob

    _labelled_sweep(tmp_path)
    files = sorted(glob.glob(str(tmp_path / "out" / "*" / "*local_steps=5.h5")))
    md = _table(capsys, files)
    assert "| variant | test_acc |" in md and "| FedSWE (k=100) | 0.6505 +/- 0.0005 |" in md, md
    assert main(["export", *files, "--out", "-"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert rows[0]["variant"] == "FedAvg" and {r["variant"] for r in rows} == {"FedAvg", "FedSWE (k=100)"}
    assert list(rows[0])[:3] == ["file", "variant", "seed"]


@pytest.mark.parametrize("target, needle", [
    ("test_acc=nan", "--time-to test_acc=nan: the target must be a finite number, got 'nan'"),
    ("test_acc>=inf", "--time-to test_acc>=inf: the target must be a finite number, got 'inf'"),
    ("test_loss<=abc", "--time-to test_loss<=abc: the target must be a finite number, got 'abc'"),
    ("test_acc=", "--time-to test_acc=: the target value is missing after '=' (e.g. test_acc=0.8)"),
])
def test_time_to_targets_are_finite_numbers(tmp_path, target, needle):
    """#44 (12): --time-to test_acc=nan was accepted (a column of '-'), and test_acc= answered
    with the sweep table's keys ('last must be an integer >= 1, at/rounds_to/scale numbers...')."""
    from conftest import cli

    path = _runs(tmp_path, {("mifa", 0): [0.1] * 4})[0]
    for option in ("--time-to", "--rounds-to"):
        p = cli(["table", path, option, target])
        assert p.returncode == 2 and p.stderr.strip() == f"fedmpi: error: {needle.replace('--time-to', option)}", \
            p.stderr


@pytest.mark.parametrize("option, value, needle", [
    ("--last", "0", "--last: must be an integer >= 1, got 0"),
    ("--digits", "-1", "--digits: must be an integer in 0..17, got -1"),
    ("--scale", "nan", "--scale: must be a finite number, got nan"),
    ("--at", "inf", "--at: must be a finite number, got inf"),
])
@pytest.mark.parametrize("metric", [[], ["--metric", "test_acc"], ["--rounds-to", "test_acc=0.5"]])
def test_bad_command_line_values_name_their_option(tmp_path, option, value, needle, metric):
    """#44's fresh hostile pass: `fedmpi table r.h5 --last 0` answered with the sweep table's key,
    'table.metrics[0].last: must be ...' (with --metric: '--metric test_acc.last'), not --last."""
    from conftest import cli

    path = _runs(tmp_path, {("mifa", 0): [0.1] * 4})[0]
    p = cli(["table", path, option, value, *metric])
    assert p.returncode == 2 and p.stderr.strip() == f"fedmpi: error: {needle}", p.stderr


def test_an_export_path_with_a_nul_byte_is_one_line(tmp_path):
    """#44's fresh hostile pass: `fedmpi export r.h5 --out $'\\0'` ended in a ValueError traceback
    (os.path.samefile on a NUL byte)."""
    from conftest import cli

    path = _runs(tmp_path, {("mifa", 0): [0.1] * 4})[0]
    p = cli(["export", path, "--out", "a\0b.csv"])
    assert p.returncode == 2 and p.stderr.strip() == "fedmpi: error: --out: 'a\\x00b.csv': not a usable path " \
        "(a NUL byte in it)", p.stderr


@pytest.mark.parametrize("entry, needle", [
    ({"rounds_to": float("nan")}, "t.rounds_to: must be a finite number, got nan"),
    ({"time_to": "inf"}, "t.time_to: must be a finite number, got 'inf'"),
    ({"at": float("nan")}, "t.at: must be a finite number, got nan"),
    ({"window": [3, 1]}, "t.window: must be [LOW, HIGH], finite numbers with LOW <= HIGH, got [3, 1]"),
    ({"last": 2.5}, "t.last: must be an integer >= 1, got 2.5"),
    ({"digits": 40}, "t.digits: must be an integer in 0..17, got 40"),
    ({"time_to": 0.5, "rounds_to": 0.5}, "t: give one of rounds_to, time_to"),
    ({"time_to": 0.5, "x": "round"}, "t.x: time_to counts virtual seconds (x: time), got x: 'round'"),
])
def test_bad_table_entries_name_their_key(entry, needle):
    with pytest.raises(InputError) as e:
        table.metric_spec({"metric": "test_acc", **entry}, "t")
    assert str(e.value).startswith(needle), str(e.value)


def test_time_to_is_one_name_in_sweep_tables_and_on_the_command_line(tmp_path, capsys):
    """#46 (2): a sweep's table said `rounds_to: V, x: time` where the command line says
    --time-to, and `time_to` was refused; the time-to column had no unit."""
    acc, time = [0.1, 0.5, 0.7, 0.9], [0.0, 12.5, 30.0, 41.0]
    path = fake_result(tmp_path / "r.h5", {"round": ROUNDS, "test_acc": acc, "time": time})
    r = results.load(path)
    sweep = table.metric_spec({"metric": "test_acc", "time_to": 0.6}, "t")
    old = table.metric_spec({"metric": "test_acc", "rounds_to": 0.6, "x": "time"}, "t")
    assert sweep == old and sweep.value(r) == 30.0 and sweep.title == "time to test_acc >= 0.6 (s)"
    out = _table(capsys, [path, "--time-to", "test_acc=0.6", "--rounds-to", "test_acc=0.6", "--metric", "time",
                          "--format", "csv"])
    row = next(csv.DictReader(io.StringIO(out)))
    assert row["time (s) mean"] == "41.0" and row["time to test_acc >= 0.6 (s) mean"] == "30.0"
    assert row["rounds to test_acc >= 0.6 mean"] == "20.0"  # a count of rounds: no unit
    assert table.metric_spec({"metric": "test_loss", "time_to": 0.3, "goal": "at_most"}, "t").title == \
        "time to test_loss <= 0.3 (s)"
    assert table.metric_spec({"metric": "time", "scale": 0.001}, "t").title == "time"  # scaled: the user's unit
