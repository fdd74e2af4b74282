"""Metrics for any algorithm (fedmpi.metrics): per-client values and summaries, the local test
split, registered metrics, callbacks at three moments, stopping early, rounds-to-target."""

from __future__ import annotations

import h5py
import numpy as np
import pytest

import fault_plugin
from conftest import cli, fedmpi, synthetic_config, write_config
from fedmpi import config, log, metrics, plugins
from fedmpi.build import build_task
from fedmpi.cli import main
from fedmpi.data.partition import split_local_test
from fedmpi.errors import InputError
from fedmpi.registry import METRICS
from fedmpi.runner import Runner
from fedmpi.runtime import World

PLUGIN = '''
import numpy as np
from fedmpi.metrics import register_metric

@register_metric("acc_gap", clients=True)
def acc_gap(m):
    """Best minus worst client accuracy (a fairness measure)."""
    return float(np.nanmax(m.clients["acc"]) - np.nanmin(m.clients["acc"]))
'''


@pytest.fixture
def acc_gap(tmp_path):
    """The plug-in file registering ``acc_gap``, loaded here; unregistered after the test."""
    path = tmp_path / "fair_plugin.py"
    path.write_text(PLUGIN)
    plugins.load([str(path)])
    yield str(path)
    METRICS._entries.pop("acc_gap", None)
    plugins._done.discard(str(path))


def _run(tmp_path, name: str, callbacks=(), **over) -> h5py.File:
    cfg = config.from_dict(synthetic_config(**over))
    out = str(tmp_path / f"{name}.h5")
    Runner(cfg, World(), out, quiet=True, callbacks=callbacks).run()
    return h5py.File(out, "r")


def test_summaries_of_known_values():
    acc = np.array([0.9, np.nan, 0.1, 0.5, 0.3, 0.7])  # a client without local test samples: NaN
    s = metrics.summarize("acc", acc, worst=0.4)
    v = np.array([0.1, 0.3, 0.5, 0.7, 0.9])
    assert s["client_acc_p10"] == pytest.approx(np.quantile(v, 0.1))
    assert s["client_acc_p50"] == pytest.approx(0.5) and s["client_acc_p90"] == pytest.approx(np.quantile(v, 0.9))
    assert s["client_acc_std"] == pytest.approx(np.std(v))
    assert s["client_acc_worst"] == pytest.approx(0.2)  # the lowest 2 of 5 accuracies
    assert metrics.summarize("loss", v, worst=0.4)["client_loss_worst"] == pytest.approx(0.8)  # the highest
    assert np.isnan(metrics.summarize("acc", np.full(3, np.nan), 0.1)["client_acc_p50"])


def test_local_test_split_is_held_out_of_training():
    parts = [np.arange(0, 10), np.arange(10, 11), np.arange(11, 14)]
    train, test = split_local_test(parts, 0.25, np.random.default_rng(0))
    assert [len(p) for p in test] == [2, 0, 1] and [len(p) for p in train] == [8, 1, 2]  # never the last sample
    for p, a, b in zip(parts, train, test):
        assert not set(a) & set(b) and sorted(set(a) | set(b)) == list(p)
    task = build_task(config.from_dict(synthetic_config(task__partition__local_test=0.2)), World().device)
    plain = build_task(config.from_dict(synthetic_config()), World().device)
    assert task.sizes.sum() + np.diff(task.local_test_offsets).sum() == plain.sizes.sum()
    assert not set(task.order.tolist()) & set(task.local_test_order.tolist())


def test_client_losses_match_their_rederivation_on_the_quadratic(tmp_path):
    u = [0.0, 10.0, 40.0]
    f = _run(tmp_path, "q", task={"dataset": "quadratic", "model": "scalar", "clients": 3, "u": u},
             train={"local_steps": 1, "lr": 0.1}, rounds=4, availability={"kind": "always"},
             evaluation={"clients": {"enabled": True, "arrays": True, "worst": 0.3}})
    with f:
        x = float(f["final/params"][0])
        loss = f["clients/loss"][:]
        assert loss.shape == (f["metrics/round"].shape[0], 3) and "clients/acc" not in f  # regression: no acc
        want = 0.5 * (x - np.array(u)) ** 2
        np.testing.assert_allclose(loss[-1], want, rtol=1e-5)
        assert f["metrics/client_loss_worst"][-1] == pytest.approx(want.max(), rel=1e-5)
        assert f["metrics/client_loss_p50"][-1] == pytest.approx(np.median(loss[-1]))


def test_a_registered_metric_appears_for_every_algorithm_and_in_the_table(tmp_path, acc_gap, capsys):
    for algo in ("fedavg_active", "fedswe", "mifa", "scaffold"):
        with _run(tmp_path, algo, algorithm={"name": algo}, task__partition__local_test=0.25,
                  evaluation={"metrics": ["acc_gap"], "clients": {"arrays": True}}) as f:
            acc = f["clients/acc"][:]
            np.testing.assert_array_equal(f["metrics/acc_gap"][:], np.nanmax(acc, 1) - np.nanmin(acc, 1))
            assert "client_acc_p10" in f["metrics"]
    assert main(["table", str(tmp_path), "--rows", "algorithm.name", "--metric", "acc_gap",
                 "--rounds-to", "test_acc=0.3", "--format", "csv"]) == 0
    out = capsys.readouterr().out
    assert "acc_gap" in out and "rounds to test_acc >= 0.3" in out
    assert all(a in out for a in ("fedavg_active", "fedswe", "mifa", "scaffold"))


def test_the_fairness_summaries_of_known_values():
    acc = np.array([0.9, np.nan, 0.1, 0.5, 0.3, 0.7])
    sizes = np.array([10, 0, 30, 20, 20, 20])
    v, n = np.array([0.9, 0.1, 0.5, 0.3, 0.7]), np.array([10, 30, 20, 20, 20])
    s = metrics.summarize("acc", acc, 0.4, ["var", "mean", "weighted", "best", "min", "max", "worst"], sizes)
    assert list(s) == [f"client_acc_{k}" for k in ("var", "mean", "weighted", "best", "min", "max", "worst")]
    assert s["client_acc_var"] == pytest.approx(np.var(v)) and s["client_acc_mean"] == pytest.approx(0.5)
    assert s["client_acc_weighted"] == pytest.approx(np.sum(v * n) / n.sum())  # LEAF's weighted mean
    assert s["client_acc_best"] == pytest.approx(0.8) and s["client_acc_worst"] == pytest.approx(0.2)
    assert (s["client_acc_min"], s["client_acc_max"]) == (0.1, 0.9)
    loss = metrics.summarize("loss", v, 0.4, ["best", "worst"])  # for a loss, the best are the lowest
    assert loss == {"client_loss_best": pytest.approx(0.2), "client_loss_worst": pytest.approx(0.8)}


COUNTED = []


def counted(m: metrics.MetricInput) -> float:
    """A metric that records that it ran and what it saw."""
    COUNTED.append(dict(m.clients))
    return float(len(m.clients))


@pytest.fixture
def registered_pair():
    """Two metrics of a plug-in: one that reads the clients, one that does not."""
    COUNTED.clear()
    METRICS.register("seen_clients", counted, clients=True)
    METRICS.register("rounds_plus_one", lambda m: m.rounds_done + 1.0)
    yield
    for n in ("seen_clients", "rounds_plus_one"):
        METRICS._entries.pop(n, None)


def test_a_loaded_metric_costs_nothing_unless_the_config_names_it(tmp_path, registered_pair, capsys):
    """Issue 35: loading a metric plug-in turned the per-client evaluation on in every run (~8x
    slower, benchmarks/metric_cost.py); now a run computes only the metrics its config names."""
    METRICS._entries.pop("seen_clients")
    with _run(tmp_path, "plain") as f:
        plain = {k: f["metrics"][k][:] for k in f["metrics"]}
    METRICS.register("seen_clients", counted, clients=True)
    log.setup(0)  # notices on stderr, as the command line prints them
    capsys.readouterr()
    with _run(tmp_path, "loaded") as f:
        assert sorted(f["metrics"]) == sorted(plain) and "clients" not in f  # no client_*, no plug-in metric
        for k in plain:
            if k not in ("wall_time", "peak_rss_mb"):
                np.testing.assert_array_equal(f["metrics"][k][:], plain[k])
    assert COUNTED == []  # never called
    assert "registered metrics rounds_plus_one, seen_clients not computed: this config does not name them in " \
           "evaluation.metrics" in capsys.readouterr().err
    with _run(tmp_path, "named", evaluation={"metrics": ["rounds_plus_one", "seen_clients"]}) as f:
        names = list(f["metrics"])
        assert "client_acc_p10" in names  # naming a metric that reads the clients evaluates them
        assert list(f["metrics/rounds_plus_one"][:]) == [1.0, 3.0, 5.0, 7.0]
        assert list(f["metrics/seen_clients"][:]) == [2.0] * 4 and len(COUNTED) == 4
        assert sorted(COUNTED[0]) == ["acc", "loss"] and COUNTED[0]["acc"].shape == (12,)
    with _run(tmp_path, "cheap", evaluation={"metrics": ["rounds_plus_one"]}) as f:  # no clients needed: none
        assert "client_acc_p10" not in f["metrics"] and list(f["metrics/rounds_plus_one"][:]) == [1.0, 3.0, 5.0, 7.0]
    assert len(COUNTED) == 4


def test_which_client_summaries_run_is_the_configs_choice(tmp_path):
    default = ["p10", "p50", "p90", "std", "worst"]  # the names of runs made before the choice
    with _run(tmp_path, "default", evaluation={"clients": {"enabled": True}}) as f:
        assert [k for k in f["metrics"] if k.startswith("client_")] == \
            [f"client_{a}_{s}" for a in ("acc", "loss") for s in default]  # h5py lists names sorted
    fair = ["mean", "worst", "best", "var", "min", "weighted"]
    with _run(tmp_path, "fair", task__partition__local_test=0.25,
              evaluation={"clients": {"arrays": True, "summaries": fair}}) as f:
        acc, loss = f["clients/acc"][-1], f["clients/loss"][-1]
        assert sorted(k for k in f["metrics"] if k.startswith("client_")) == \
            sorted(f"client_{a}_{s}" for a in ("acc", "loss") for s in fair)
        assert f["metrics/client_acc_var"][-1] == pytest.approx(np.var(acc))
        assert f["metrics/client_acc_min"][-1] == acc.min() and f["metrics/client_loss_mean"][-1] == \
            pytest.approx(loss.mean())
    with _run(tmp_path, "none", evaluation={"clients": {"arrays": True, "summaries": []}}) as f:
        assert "clients/acc" in f and not [k for k in f["metrics"] if k.startswith("client_")]


@pytest.mark.parametrize("evaluation, needle", [
    ({"metrics": ["acc_gapp"]}, "evaluation.metrics: no registered metric 'acc_gapp' (registered: "),
    ({"metrics": ["test_acc"]}, "the built-in metrics are always logged"),
    ({"metrics": "acc_gap"}, "evaluation.metrics: must be a list"),
    ({"clients": {"summaries": ["p25"]}}, "evaluation.clients.summaries: unknown summary 'p25' (allowed: p10,"),
    ({"clients": {"summaries": ["var", "var"]}}, "evaluation.clients.summaries: 'var' is named twice"),
])
def test_evaluation_choices_are_checked(evaluation, needle):
    with pytest.raises(InputError) as e:
        config.from_dict(synthetic_config(evaluation=evaluation))
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_an_unknown_metric_is_exit_2_in_one_line(tmp_path):
    cfg = write_config(tmp_path / "bad.yaml", synthetic_config(evaluation={"metrics": ["acc_gapp"]}))
    p = cli(["run", cfg, "--quiet"])
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "evaluation.metrics: no registered metric 'acc_gapp'" in p.stderr and not (tmp_path / "runs").exists()


def test_a_named_metric_may_not_shadow_one_of_the_run(tmp_path):
    METRICS.register("client_acc_p10", lambda m: 0.0)
    try:
        with pytest.raises(InputError, match="evaluation.metrics: 'client_acc_p10' is already a metric of this run"):
            _run(tmp_path, "clash", evaluation={"metrics": ["client_acc_p10"], "clients": {"enabled": True}})
        _run(tmp_path, "fine", evaluation={"metrics": ["client_acc_p10"]}).close()  # no summaries: no clash
    finally:
        METRICS._entries.pop("client_acc_p10", None)


def test_callbacks_at_three_moments_and_stopping_early(tmp_path):
    seen = []

    def evaluated(run, rounds_done, row):
        seen.append(("evaluated", rounds_done, row["test_acc"]))
        return "enough" if rounds_done == 4 else None

    later = []  # an evaluated callback after the one that stops still runs
    with _run(tmp_path, "cb", rounds=10, callbacks=[lambda run, t: seen.append(("start", t)),
                                                    ("round_end", lambda run, t: seen.append(("end", t))),
                                                    ("evaluated", evaluated),
                                                    ("evaluated", lambda run, r, row: later.append(r))]) as f:
        assert f.attrs["status"] == "completed" and f.attrs["rounds_done"] == 4
        assert f.attrs["stopped_early"] == "enough" and f.attrs["stopped_round"] == 4
        assert list(f["metrics/round"][:]) == [0, 2, 4]
        assert [s[2] for s in seen if s[0] == "evaluated"] == list(f["metrics/test_acc"][:])
        assert "evaluated:" in f.attrs["callbacks"] and "round_end:" in f.attrs["callbacks"]
    assert [s for s in seen if s[0] != "evaluated"] == [(w, t) for t in range(4) for w in ("start", "end")]
    assert later == [0, 2, 4]


def test_stop_at_a_target_and_its_errors(tmp_path):
    with _run(tmp_path, "stop", rounds=40, runtime={"progress": False, "stop_at": {"metric": "test_acc",
                                                                                     "value": 0.45}}) as f:
        acc = f["metrics/test_acc"][:]
        assert acc[-1] >= 0.45 and (acc[:-1] < 0.45).all() and f.attrs["rounds_done"] < 40
        assert f.attrs["stopped_early"].startswith("test_acc >= 0.45")
        assert f.attrs["callbacks"] == "evaluated: runtime.stop_at"
    cfg = write_config(tmp_path / "bad.yaml", synthetic_config(runtime={"stop_at": {"metric": "test_accc"}}))
    p = cli(["run", cfg, "--quiet"])
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "runtime.stop_at.metric" in p.stderr


def test_client_arrays_survive_a_resume_bit_for_bit(tmp_path, acc_gap):
    over = dict(rounds=10, eval_every=2, runtime={"checkpoint_every": 2, "progress": False},
                task__partition__local_test=0.2, evaluation={"clients": {"enabled": True, "arrays": True},
                                                             "metrics": ["acc_gap"]})
    cfg = config.from_dict(synthetic_config(**over))
    Runner(cfg, World(), str(tmp_path / "straight.h5"), quiet=True).run()
    with pytest.raises(RuntimeError, match="injected"):
        Runner(cfg, World(), str(tmp_path / "cut.h5"), quiet=True, callbacks=[fault_plugin.inject("0:5:raise")]).run()
    Runner(cfg, World(), str(tmp_path / "cut.h5"), quiet=True, resume=True).run()
    with h5py.File(tmp_path / "straight.h5") as a, h5py.File(tmp_path / "cut.h5") as b:
        assert a["clients/acc"].shape == (6, 12)
        for k in ("clients/acc", "clients/loss", "metrics/acc_gap", "metrics/client_loss_worst"):
            np.testing.assert_array_equal(a[k][:], b[k][:])


@pytest.mark.slow
@pytest.mark.mpi
def test_client_metrics_same_bits_on_1_2_3_ranks(tmp_path, acc_gap):
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(
        task__partition__local_test=0.2, evaluation={"clients": {"enabled": True, "arrays": True},
                                                     "metrics": ["acc_gap"]}))
    outs = []
    for ranks in (0, 2, 3):
        outs.append(str(tmp_path / f"r{ranks}.h5"))
        fedmpi(["run", cfg, "--quiet", "--plugin", acc_gap, "--out", outs[-1]], ranks=ranks)
    with h5py.File(outs[0]) as a:
        for other in outs[1:]:
            with h5py.File(other) as b:
                for k in ("clients/acc", "clients/loss", "metrics/acc_gap", "metrics/client_acc_p10"):
                    np.testing.assert_array_equal(a[k][:], b[k][:])


def test_rounds_to_target_in_the_table(tmp_path, capsys):
    from fake_results import fake_result
    from fedmpi.results import table

    for seed, acc in ((0, [0.1, 0.5, 0.8, 0.9]), (1, [0.1, 0.3, 0.6, 0.85])):
        fake_result(tmp_path / f"s{seed}.h5", {"round": [0, 10, 20, 30], "test_acc": acc,
                                               "test_loss": [1 - a for a in acc]}, seed=seed)
    assert main(["table", str(tmp_path), "--rounds-to", "test_acc=0.8", "--rounds-to", "test_loss<=0.45",
                 "--rounds-to", "test_acc>=0.95", "--format", "csv"]) == 0
    header, row = capsys.readouterr().out.strip().splitlines()
    assert "rounds to test_acc >= 0.8" in header and "rounds to test_loss <= 0.45" in header
    assert row == "25.0,5.0,2,20.0,0.0,2,,,0"  # (20, 30), (20, 20); never reached: no number, n = 0
    spec = table.metric_spec({"metric": "test_loss", "rounds_to": 0.45, "goal": "at_most"}, "table.metrics[0]")
    assert spec.title == "rounds to test_loss <= 0.45"
    assert main(["table", str(tmp_path), "--rounds-to", "test_acc"]) == 2
    assert "--rounds-to test_acc: must be METRIC=V" in capsys.readouterr().err
