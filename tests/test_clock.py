"""The virtual clock (issue #33): client durations, synchronous rounds with deadlines,
over-selection and dropout, the asynchronous server (FedBuff, FedAsync), /events and the metric
``time``; the closed forms of docs/REPRODUCTION.md ("The clock")."""

from __future__ import annotations

import copy

import h5py
import numpy as np
import pytest
from conftest import cli, fedmpi, synthetic_config, write_config
from fault_plugin import inject

from fedmpi import config
from fedmpi.build import build_components
from fedmpi.clock.durations import Durations
from fedmpi.clock.params import ClockParams
from fedmpi.clock.events import OUTCOMES
from fedmpi.clock.rounds import RoundClock
from fedmpi.errors import InputError
from fedmpi.runner import Runner
from fedmpi.runtime import World


def devices(tmp_path, step_times, comm_times=None, name="dev.csv") -> str:
    comm_times = comm_times or [0.0] * len(step_times)
    path = tmp_path / name
    path.write_text("client,step_time,comm_time\n" + "".join(f"{i},{s},{c}\n" for i, (s, c)
                                                               in enumerate(zip(step_times, comm_times))))
    return str(path)


def quadratic(u, rounds, algorithm, clock, **over) -> dict:
    cfg = {"seed": 0, "rounds": rounds, "eval_every": 1,
           "task": {"dataset": "quadratic", "model": "scalar", "clients": len(u), "u": list(u), "x0": 0.0},
           "train": {"local_steps": 1, "batch_size": 1, "lr": 0.1},
           "algorithm": algorithm, "clock": clock, "runtime": {"progress": False}}
    cfg.update(over)
    return cfg


def run(cfg: dict, path, **kw) -> h5py.File:
    Runner(config.from_dict(copy.deepcopy(cfg)), World(), str(path), quiet=True, **kw).run()
    return h5py.File(path)


def events(f: h5py.File) -> dict[str, np.ndarray]:
    return {k: f["events"][k][:] for k in f["events"]}


ASYNC = {"seed": 2, "rounds": 8, "eval_every": 2,
         "task": {"dataset": "synthetic", "clients": 8, "model": "logreg",
                  "synthetic": {"samples": 200, "test_samples": 40, "features": 3, "classes": 2}},
         "train": {"local_steps": 3, "batch_size": 4, "lr": 0.1, "local_steps_draw": "uniform"},
         "algorithm": {"name": "fedbuff", "concurrency": 4, "buffer": 3},
         "clock": {"kind": "lognormal", "step_time": 1.0, "comm_time": 2.0, "sigma": 0.8, "dropout": 0.15},
         "runtime": {"progress": False}}
SYNC = dict(ASYNC, algorithm={"name": "fedavg_active"}, availability={"kind": "cohort", "size": 4},
            clock={"kind": "lognormal", "step_time": 1.0, "comm_time": 2.0, "sigma": 0.8, "deadline": 6.0,
                   "over_select": 0.5, "dropout": 0.1})
FEDASYNC = dict(ASYNC, algorithm={"name": "fedasync", "concurrency": 3, "alpha": 0.5, "staleness": "poly",
                                  "max_staleness": 3})
SLOTS = dict(ASYNC, availability={"kind": "stationary", "base": {"kind": "fixed", "values": 0.3}},
             clock=dict(ASYNC["clock"], slot=5.0))  # availability in time: a Bernoulli draw every 5 s


# ----------------------------------------------------------------------------- durations

def test_durations_of_each_kind(tmp_path):
    const = Durations(ClockParams(kind="constant", step_time=2.0, comm_time=5.0), 4, seed=1)
    assert np.array_equal(const.of(np.array([0, 3]), np.array([1, 3])), [7.0, 11.0])
    logn = Durations(ClockParams(kind="lognormal", step_time=1.0, sigma=0.5), 2000, seed=1)
    again = Durations(ClockParams(kind="lognormal", step_time=1.0, sigma=0.5), 10, seed=1)
    assert np.array_equal(logn.step_time[:10], again.step_time)  # a client's speed is its own draw
    assert 0.9 < np.median(logn.step_time) < 1.1 and 0.4 < np.log(logn.step_time).std() < 0.6
    other = Durations(ClockParams(kind="lognormal", step_time=1.0, sigma=0.5), 10, seed=2)
    assert not np.array_equal(other.step_time, again.step_time)
    f = Durations(ClockParams(kind="file", file=devices(tmp_path, [0.5, 2.0], [1.0, 0.0])), 2, seed=0)
    assert np.array_equal(f.of(np.array([1, 0]), np.array([2, 2])), [4.0, 2.0])


@pytest.mark.parametrize("text, says", [
    ("client,step\n0,1\n", "header"), ("client,step_time,comm_time\n0,1\n", "line 2: expected 3 fields"),
    ("client,step_time,comm_time\n0,x,1\n1,1,1\n", "line 2: not a client id"),
    ("client,step_time,comm_time\n0,1,0\n5,1,0\n", "client 5 outside 0..1"),
    ("client,step_time,comm_time\n0,0,0\n1,1,0\n", "step_time must be in (0, 1e+09] s"),
    ("client,step_time,comm_time\n0,1,0\n0,1,0\n", "client 0 given twice"),
    ("client,step_time,comm_time\n0,1,0\n", "no row for 1 of the 2 clients"),
    (b"\xff\xfe\x00", "not UTF-8"),
])
def test_bad_device_files_are_one_line(tmp_path, text, says):
    path = tmp_path / "dev.csv"
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(InputError) as e:
        Durations(ClockParams(kind="file", file=str(path)), 2, seed=0)
    assert str(e.value).startswith(f"clock.file: {path}") and says in str(e.value) and "\n" not in str(e.value)


def test_a_missing_device_file_exits_2_naming_the_key(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", dict(SYNC, clock={"kind": "file", "file": "nowhere.csv"}))
    p = cli(["run", cfg, "--out", str(tmp_path / "r.h5")])
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0 and "clock.file: nowhere.csv: file not found" \
        in p.stderr


# ----------------------------------------------------------------------------- synchronous rounds

def test_round_clock_keeps_what_the_rules_say(tmp_path):
    path = devices(tmp_path, [1.0, 2.0, 3.0, 4.0, 5.0])
    asked, steps = np.arange(5), np.ones(5)
    clock = RoundClock(Durations(ClockParams(kind="file", file=path), 5, 0))
    got = clock.round(0, asked, steps)
    assert np.array_equal(got.kept, asked) and got.duration == 5.0 and clock.now == 5.0
    clock = RoundClock(Durations(ClockParams(kind="file", file=path, deadline=3.5), 5, 0))
    got = clock.round(0, asked, steps)
    assert np.array_equal(got.kept, [0, 1, 2]) and np.array_equal(got.late, [3, 4]) and got.duration == 3.5
    clock = RoundClock(Durations(ClockParams(kind="file", file=path, over_select=1.0), 5, 0), keep=2)
    got = clock.round(0, np.array([1, 3, 4]), np.ones(3))
    assert np.array_equal(got.kept, [1, 3]) and np.array_equal(got.surplus, [4]) and got.duration == 4.0
    ev = clock.events.take()
    assert [OUTCOMES[o] for o in ev["outcome"]] == ["kept", "kept", "surplus"]
    assert np.array_equal(ev["finish"], [2.0, 4.0, 5.0]) and not len(clock.events.take()["round"])
    clock = RoundClock(Durations(ClockParams(kind="file", file=path, dropout=0.5), 5, 0))
    got = clock.round(3, asked, steps)
    assert len(got.failed) and len(got.kept) and np.array_equal(np.sort(np.r_[got.kept, got.failed]), asked)


def test_without_a_clock_nothing_changes(tmp_path):
    plain = synthetic_config()
    timeless = dict(synthetic_config(), clock={"kind": "none"})
    a, b = run(plain, tmp_path / "a.h5"), run(timeless, tmp_path / "b.h5")
    assert np.array_equal(a["final/params"][:], b["final/params"][:])
    assert "time" not in a["metrics"] and "events" not in a
    assert config.from_dict(plain).resume_digest() == config.from_dict(timeless).resume_digest()


def test_deadline_keeps_the_clients_that_fit_closed_form(tmp_path):
    """FedAvg with constant d_i = (1, 2, 5) s and a 3 s deadline: only clients 0 and 1 count, so x^t
    tends to (u_0 + u_1) / 2 = 10, not the mean 40 of all three; every round lasts the deadline."""
    cfg = quadratic([0.0, 20.0, 100.0], 300, {"name": "fedavg_active"},
                    {"kind": "file", "file": devices(tmp_path, [1.0, 2.0, 5.0]), "deadline": 3.0})
    f = run(cfg, tmp_path / "r.h5")
    assert abs(f["metrics/x"][-1] - 10.0) < 1e-3
    assert np.allclose(f["metrics/time"][:], 3.0 * f["metrics/round"][:])
    ev = events(f)
    assert set(ev["client"][ev["outcome"] == OUTCOMES.index("late")]) == {2}
    without = run(dict(cfg, clock={"kind": "file", "file": cfg["clock"]["file"]}), tmp_path / "w.h5")
    assert abs(without["metrics/x"][-1] - 40.0) < 1e-3 and without["metrics/time"][-1] == 5.0 * 300


def test_over_selection_keeps_the_first_k(tmp_path):
    cfg = dict(SYNC, clock=dict(SYNC["clock"], deadline=None, dropout=0.0))
    f = run(cfg, tmp_path / "r.h5")
    ev = events(f)
    for t in range(cfg["rounds"]):
        mine = {k: v[ev["round"] == t + 1] for k, v in ev.items()}
        assert len(mine["client"]) == 6  # ceil(1.5 * 4) asked
        kept = mine["outcome"] == OUTCOMES.index("kept")
        assert kept.sum() == 4 and mine["finish"][kept].max() <= mine["finish"][~kept].min()


# ----------------------------------------------------------------------------- asynchronous

def test_fedbuff_fixed_point_closed_form(tmp_path):
    """FedBuff with M = m = 2, K = 1, no staleness weight, constant d = (1, 3) s: client i reports
    at rate 1/d_i, so x^t settles on a cycle around x* = sum_i u_i / d_i / sum_i 1 / d_i = 25 (not
    the mean 50), and over whole cycles the models the arriving clients started from average to x*
    exactly (docs/REPRODUCTION.md, "The clock")."""
    cfg = quadratic([0.0, 100.0], 800, {"name": "fedbuff", "concurrency": 2, "buffer": 1, "staleness": "none",
                                        "global_lr": 0.5}, {"kind": "file", "file": devices(tmp_path, [1.0, 3.0])})
    f = run(cfg, tmp_path / "r.h5")
    x = f["metrics/x"][:]  # x^r at round r (eval_every 1)
    assert abs(x[400:].mean() - 25.0) < 0.1 and abs(x[400:] - 25.0).max() < 3.0
    assert f["metrics/time"][-1] == 600.0  # 4 arrivals every 3 s
    ev = events(f)
    assert np.array_equal(np.bincount(ev["client"]), [600, 200])
    started = x[ev["version"][-400:]]  # 100 whole cycles of 4 arrivals: each arrival's start model
    assert abs(started.mean() - 25.0) < 1e-4
    sync = run(dict(cfg, algorithm={"name": "fedavg_active", "global_lr": 0.5}), tmp_path / "s.h5")
    assert abs(sync["metrics/x"][-1] - 50.0) < 1e-3 and sync["metrics/time"][-1] == 3.0 * 800


def test_fedasync_mixes_each_arrival(tmp_path):
    """FedAsync on the quadratic task with K = 1: x <- (1 - a) x + a x_i, x_i the client's model."""
    cfg = quadratic([0.0, 100.0], 3, {"name": "fedasync", "concurrency": 1, "alpha": 0.5, "staleness": "none"},
                    {"kind": "constant", "step_time": 1.0})
    f = run(cfg, tmp_path / "r.h5")
    ev, x = events(f), [0.0]
    for c in ev["client"]:  # one client in flight: trained from the current model, staleness 0
        u = [0.0, 100.0][c]
        x.append(0.5 * x[-1] + 0.5 * (x[-1] + 0.1 * (u - x[-1])))
    assert np.allclose(f["metrics/x"][:], x, atol=1e-5) and not ev["staleness"].any()


@pytest.mark.parametrize("cfg", [ASYNC, FEDASYNC, SLOTS, SYNC, dict(SLOTS, algorithm={"name": "fedavg_active"})],
                         ids=["fedbuff", "fedasync", "fedbuff-slots", "sync", "sync-slots"])
def test_resumes_with_clients_in_flight(tmp_path, cfg):
    """A run cut at round 5 and resumed from its checkpoint (tasks in flight and their computed
    updates, the clock, the availability step) ends as the uninterrupted run: model, times, events."""
    cfg = dict(cfg, runtime={"progress": False, "checkpoint_every": 1})
    a = run(cfg, tmp_path / "a.h5")
    with pytest.raises(RuntimeError, match="injected"):
        run(cfg, tmp_path / "b.h5", callbacks=[inject("0:5:raise")])
    b = run(cfg, tmp_path / "b.h5", resume=True)
    assert np.array_equal(a["final/params"][:], b["final/params"][:])
    assert np.array_equal(a["metrics/time"][:], b["metrics/time"][:])
    ea, eb = events(a), events(b)
    assert all(np.array_equal(ea[k], eb[k]) for k in ea)
    if cfg["algorithm"]["name"] != "fedavg_active":
        assert (ea["staleness"] > 0).any()  # tasks were in flight across server steps (and checkpoints)


@pytest.mark.slow
@pytest.mark.mpi
def test_same_bits_on_1_2_and_3_ranks(tmp_path):
    paths = {}
    for name, cfg in (("fedbuff", ASYNC), ("fedasync", FEDASYNC), ("sync", SYNC), ("slots", SLOTS)):
        c = write_config(tmp_path / f"{name}.yaml", cfg)
        for ranks in (0, 2, 3):
            paths[name, ranks] = tmp_path / f"{name}-{ranks}.h5"
            fedmpi(["run", c, "--out", str(paths[name, ranks])], ranks=ranks)
    for name in ("fedbuff", "fedasync", "sync", "slots"):
        with h5py.File(paths[name, 0]) as one:
            for ranks in (2, 3):
                with h5py.File(paths[name, ranks]) as other:
                    assert np.array_equal(one["final/params"][:], other["final/params"][:]), (name, ranks)
                    e1, e2 = events(one), events(other)
                    assert all(np.array_equal(e1[k], e2[k]) for k in e1), (name, ranks)


# ----------------------------------------------------------------------------- availability in time

def test_sync_rounds_ask_whoever_is_available_at_their_start(tmp_path):
    """clock.slot: 2 s per step of an inline schedule; rounds of 1 s each ask the step their start
    falls in, and a round nobody is available in waits for the next step."""
    schedule = [[0, 1], [2], [], [0, 2]]
    cfg = quadratic([0.0, 10.0, 20.0], 6, {"name": "fedavg_active"},
                    {"kind": "constant", "step_time": 1.0, "slot": 2.0},
                    availability={"kind": "trace", "schedule": schedule, "trace_repeat": True})
    f = run(cfg, tmp_path / "r.h5")
    ev = events(f)
    starts = {r: ev["dispatch"][ev["round"] == r] for r in range(1, 7)}
    asked = {r: sorted(ev["client"][ev["round"] == r]) for r in range(1, 7)}
    assert [float(starts[r][0]) if len(starts[r]) else None for r in range(1, 7)] == [0.0, 1.0, 2.0, 3.0, None, 6.0]
    assert [asked[r] for r in range(1, 7)] == [[0, 1], [0, 1], [2], [2], [], [0, 2]]
    assert np.array_equal(f["metrics/time"][:], [0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 7.0])


def test_async_dispatches_only_clients_available_in_seconds(tmp_path):
    """A FedScale-style intervals trace read in seconds (clock.slot: 1): client 1 is on only in
    [5, 10), client 0 always; every dispatch of client 1 falls in its interval."""
    trace = tmp_path / "trace.json"
    trace.write_text('{"0": {"active": [0], "inactive": [], "finish_time": 1000}, "1": [[5, 10]]}')
    cfg = quadratic([0.0, 10.0], 30, {"name": "fedbuff", "concurrency": 2, "buffer": 1},
                    {"kind": "constant", "step_time": 1.5, "slot": 1.0},
                    availability={"kind": "trace", "trace": str(trace), "trace_repeat": False})
    cfg["rounds"] = 30
    f = run(cfg, tmp_path / "r.h5")
    ev = events(f)
    ones = ev["dispatch"][ev["client"] == 1]
    assert len(ones) >= 2 and ((ones >= 5) & (ones < 10)).all()
    assert (ev["client"] == 0).sum() > len(ones)


# ----------------------------------------------------------------------------- refusals

@pytest.mark.parametrize("over, says", [
    ({"clock": {"kind": "none"}}, "clock.kind: algorithm.name fedbuff is asynchronous"),
    ({"clock": dict(ASYNC["clock"], deadline=3.0)}, "clock.deadline: algorithm.name fedbuff is asynchronous"),
    ({"availability": {"kind": "cohort", "size": 2}}, "availability.kind: algorithm.name fedbuff dispatches at "
                                                      "virtual times: set clock.slot"),
    ({"algorithm": {"name": "fedavg_active"}, "clock": dict(ASYNC["clock"], slot=2.0),
      "privacy": {"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 1.0}},
     "clock.slot: privacy.mechanism accounts for one availability draw per round"),
    ({"algorithm": {"name": "fedasync", "concurrency": 4},
      "privacy": {"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 1.0}},
     "privacy.mechanism: algorithm.name 'fedasync' is not covered by the privacy mechanism: it mixes each client's"),
    ({"privacy": {"mechanism": "gaussian", "clip": 1.0, "epsilon": 4.0}},
     "privacy.epsilon: algorithm.name fedbuff is an asynchronous server"),
    ({"algorithm": {"name": "fedbuff", "concurrency": 9}}, "algorithm.concurrency: 9 clients in flight"),
    ({"algorithm": {"name": "dspodfl"}, "topology": {"kind": "ring"}}, "clock.kind: algorithm.name dspodfl"),
    ({"algorithm": {"name": "fedknown"}, "clock": dict(ASYNC["clock"])},
     "clock.dropout: algorithm.name fedknown weights"),
    ({"algorithm": {"name": "fedavg_active"}, "clock": dict(ASYNC["clock"], over_select=0.5)},
     "clock.over_select: over-selection asks more clients of a cohort of K (availability.kind: cohort)"),
    ({"algorithm": {"name": "fedavg_active"}, "clock": {"kind": "none", "deadline": 2.0}},
     "clock.deadline: needs a clock"),
    ({"algorithm": {"name": "fedasync", "concurrency": 2, "global_lr": 0.5}}, "algorithm.global_lr: fedasync"),
])
def test_refusals_name_the_keys(over, says):
    cfg = dict(copy.deepcopy(ASYNC), **copy.deepcopy(over))
    with pytest.raises(InputError) as e:
        build_components(config.from_dict(cfg), World())
    assert str(e.value).startswith(says) and "\n" not in str(e.value)


def test_async_algorithms_do_not_pack():
    from fedmpi.packed import pack_key

    key, why = pack_key(config.from_dict(copy.deepcopy(ASYNC)))
    assert key is None and "asynchronous" in why
    assert pack_key(config.from_dict(copy.deepcopy(SYNC)))[0] is not None


# ----------------------------------------------------------------------------- reading the results

def test_time_in_tables_and_plots(tmp_path):
    cfg = quadratic([0.0, 20.0, 100.0], 12, {"name": "fedavg_active"},
                    {"kind": "file", "file": devices(tmp_path, [1.0, 2.0, 5.0]), "deadline": 3.0})
    run(cfg, tmp_path / "r.h5").close()
    p = cli(["table", str(tmp_path / "r.h5"), "--time-to", "x>=5", "--rounds-to", "x>=5", "--format", "csv"])
    assert p.returncode == 0, p.stderr
    with h5py.File(tmp_path / "r.h5") as f:
        first = int(np.flatnonzero(f["metrics/x"][:] >= 5)[0])
        want_round, want_time = f["metrics/round"][first], f["metrics/time"][first]
    assert "time to x >= 5" in p.stdout and want_time == 3.0 * want_round
    assert p.stdout.strip().splitlines()[-1] == f"{want_round:.1f},0.0,1,{want_time:.1f},0.0,1"
    assert cli(["plot", str(tmp_path / "r.h5"), "--x", "time", "--metric", "x", "--out", str(tmp_path / "x.png")]
               ).returncode == 0
    assert (tmp_path / "x.png").stat().st_size > 0
    p = cli(["plot", str(tmp_path / "r.h5"), "--x", "clock", "--metric", "x", "--out", "y.png"])
    assert p.returncode == 2 and "--x: must be round, sim_delay, wall_time or time" in p.stderr


def test_fedscale_device_map(tmp_path):
    """FedScale's client_device_capacity (a pickle of plain dicts, read without running code; or
    JSON): the k-th smallest device id is client k; a step costs 3 B ms-per-sample, a task sends
    the model (32 d bits) twice."""
    import pickle

    devices_ = {7: {"computation": 20.0, "communication": 1000.0}, 3: {"computation": 10.0, "communication": 500.0},
                9: {"computation": 5.0, "communication": 100.0}}
    path = tmp_path / "device_info.pkl"
    path.write_bytes(pickle.dumps(devices_))
    d = Durations(ClockParams(kind="file", file=str(path)), 2, seed=0, batch_size=10, dim=1000)
    assert np.allclose(d.step_time, [0.3, 0.6]) and np.allclose(d.comm_time, [0.128, 0.064])
    (tmp_path / "d.json").write_text('{"1": {"computation": 1.0, "communication": 1.0}}')
    with pytest.raises(InputError, match="1 devices, fewer than task.clients"):
        Durations(ClockParams(kind="file", file=str(tmp_path / "d.json")), 2, seed=0)

    class Evil:
        def __reduce__(self):
            return (print, ("ran",))

    path.write_bytes(pickle.dumps({0: Evil()}))
    with pytest.raises(InputError, match="unreadable device map"):
        Durations(ClockParams(kind="file", file=str(path)), 1, seed=0)


def test_packed_sweep_with_clocks_equals_unpacked(tmp_path, capsys):
    """Synchronous runs with a clock pack (the clock acts in begin_round) and give their unpacked
    bits, times and events; an asynchronous cell runs alone, saying why."""
    import yaml

    from fedmpi.cli import main
    from fedmpi.results import sweepfile

    write_config(tmp_path / "base.yaml", SYNC)
    files = {}
    for name, pack in (("alone", ["--quiet"]), ("packed", ["--pack", "4"])):
        data = {"base": "base.yaml", "out": str(tmp_path / name),
                "variants": [{"label": "over"}, {"label": "deadline", "clock.over_select": 0.0},
                             {"label": "buff", "algorithm.name": "fedbuff", "algorithm.concurrency": 4,
                              "algorithm.buffer": 2, "availability.kind": "always",
                              "clock.deadline": None, "clock.over_select": 0.0}],
                "grid": {"seed": [0, 1]}}
        path = tmp_path / f"{name}.sweep.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        assert main(["sweep", str(path), *pack]) == 0
        files[name] = {c.name: c.path for c in sweepfile.load(str(path)).cells}
    assert "cannot pack (algorithm fedbuff is asynchronous" in capsys.readouterr().err
    for cell, a in files["alone"].items():
        with h5py.File(a) as fa, h5py.File(files["packed"][cell]) as fb:
            assert np.array_equal(fa["final/params"][:], fb["final/params"][:]), cell
            assert np.array_equal(fa["metrics/time"][:], fb["metrics/time"][:]), cell
            ea, eb = events(fa), events(fb)
            assert all(np.array_equal(ea[k], eb[k]) for k in ea), cell


def test_event_outcomes_are_stored_with_their_names(tmp_path):
    """#46 (5): /events/outcome was an unnamed int8 (the names only in an attribute of the group).
    It is an HDF5 enum now, and records_frame("events") shows the names; a file written before
    (plain int8 plus the attribute) reads the same."""
    pd = pytest.importorskip("pandas")
    from fedmpi import results

    cfg = quadratic([0.0, 20.0, 100.0], 4, {"name": "fedavg_active"},
                    {"kind": "file", "file": devices(tmp_path, [1.0, 2.0, 5.0]), "deadline": 3.0})
    run(cfg, tmp_path / "r.h5").close()
    with h5py.File(tmp_path / "r.h5") as f:
        assert h5py.check_enum_dtype(f["events/outcome"].dtype) == {n: i for i, n in enumerate(OUTCOMES)}
        codes = f["events/outcome"][:]
    frame = results.load(str(tmp_path / "r.h5")).records_frame("events")
    assert list(frame["outcome"]) == ["kept", "kept", "late"] * 4 and list(frame["client"]) == [0, 1, 2] * 4
    assert isinstance(frame["outcome"].dtype, pd.CategoricalDtype)
    assert list(frame["outcome"].cat.categories) == list(OUTCOMES)
    assert frame[frame["outcome"] == "late"]["client"].unique().tolist() == [2]
    with h5py.File(tmp_path / "r.h5", "a") as f:  # as fedmpi wrote it before: int8 codes, names in an attribute
        del f["events/outcome"]
        f["events/outcome"] = codes.astype(np.int8)
        assert f["events"].attrs["outcomes"] == ",".join(OUTCOMES)
    assert results.load(str(tmp_path / "r.h5")).records_frame("events").equals(frame)
    with h5py.File(tmp_path / "r.h5", "a") as f:
        f["events/outcome"][0] = 9
    with pytest.raises(InputError, match=r"/events/outcome holds code 9, not one of"):
        results.load(str(tmp_path / "r.h5")).records_frame("events")
