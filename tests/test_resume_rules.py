"""What a resume may change and what it may not (#38 items 1 and 4, #35 item 8).

- Every input file that defines a result is fingerprinted at the start; continuing a run after one
  of them changed is refused with one line naming the key and the file (``--overwrite`` restarts).
- Keys that take effect on a resume (``rounds``, ``eval_every``, ``runtime.csv``, ...) are stored as
  the file's config, with the history of changes; newly asked metrics and per-client arrays are
  logged from the resume on (NaN before); the participation mask cannot be, so a change of
  ``runtime.log_availability`` is refused.
- A completed run keeps its final state, so a larger ``rounds`` extends it, giving the same bits as
  a run of that many rounds (1 and 2 ranks); refused where a component reads ``rounds``.
"""

from __future__ import annotations

import json
import os

import h5py
import numpy as np
import pytest

import fault_plugin
from conftest import fedmpi, synthetic_config, write_config
from fedmpi import config
from fedmpi.errors import InputError, Interrupted
from fedmpi.runner import Runner
from fedmpi.runtime import World


def _interrupted(cfg: config.Config, out: str) -> None:
    """A run stopped by SIGUSR1 before round 3, checkpointed after round 3 (in-process)."""
    with pytest.raises(Interrupted):
        Runner(cfg, World(), out, quiet=True, callbacks=[fault_plugin.inject("0:2:usr1")]).run()


def _same(a: str, b: str, mask: bool = False) -> None:
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        assert sorted(fa["metrics"]) == sorted(fb["metrics"])
        for k in fa["metrics"]:
            if k not in ("wall_time", "peak_rss_mb"):
                np.testing.assert_array_equal(fa["metrics"][k][:], fb["metrics"][k][:], err_msg=k)
        np.testing.assert_array_equal(fa["final/params"][:], fb["final/params"][:])
        if mask:
            np.testing.assert_array_equal(fa["availability/mask"][:], fb["availability/mask"][:])
        assert fa.attrs["status"] == fb.attrs["status"] == "completed"


# ----------------------------------------------------------------------------- 1: input files

def _leaf_file(path, shift: float) -> str:
    users = {f"u{u}": {"x": [[float(u + i), 1.0] for i in range(6)], "y": [(u + i) % 3 for i in range(6)]}
             for u in range(4)}
    users["u0"]["x"][0][1] += shift
    path.write_text(json.dumps({"users": list(users), "num_samples": [6] * 4, "user_data": users}))
    return str(path)


@pytest.mark.parametrize("what", ["steps", "trace", "graph", "leaf"])
def test_an_input_file_changed_before_a_resume_is_refused(tmp_path, what):
    """#38 item 1: editing a steps file (a trace, a graph, a LEAF split) of an interrupted run and
    running the same command gave exit 0 and a model that belongs to neither input."""
    data = synthetic_config(rounds=6, eval_every=2, runtime={"checkpoint_every": 1, "progress": False})
    path = tmp_path / "input.txt"
    if what == "steps":
        key, text, edited = "train.local_steps_file", "2 " * 12, "2 " * 11 + "3"
        data["train"]["local_steps_file"] = str(path)
    elif what == "trace":
        key, text, edited = "availability.trace", "0 1 2\n3 4\n", "0 1 2\n3 5\n"
        data["availability"] = {"kind": "trace", "trace": str(path), "trace_repeat": True}
    elif what == "graph":
        key, text, edited = "topology.file", "".join(f"{i} {(i + 1) % 12}\n" for i in range(12)), None
        edited = text + "0 6\n"
        data.update(algorithm={"name": "dgd"}, availability={"kind": "always"},
                    topology={"kind": "file", "file": str(path)})
    else:
        key, text, edited = "task.leaf.train", None, None
        data["task"] = {"dataset": "leaf", "model": "logreg", "clients": 4, "partition": {"kind": "natural"},
                        "leaf": {"train": _leaf_file(tmp_path / "train.json", 0.0),
                                 "test": _leaf_file(tmp_path / "test.json", 0.0)}}
    if text is not None:
        path.write_text(text)
    cfg, out = config.from_dict(data), str(tmp_path / "r.h5")
    _interrupted(cfg, out)
    os.utime(tmp_path / ("train.json" if what == "leaf" else "input.txt"), ns=(1, 1))  # touched, same content
    Runner(cfg, World(), str(tmp_path / "other.h5"), quiet=True)  # (a run elsewhere reads it as it is)
    if what == "leaf":
        _leaf_file(tmp_path / "train.json", 0.5)
        path = tmp_path / "train.json"
    else:
        path.write_text(edited)
    with pytest.raises(InputError, match=rf"^{key}: {path}: changed since this run started; continuing it after "
                                         r"round 3 would mix two inputs in one result: restore the file, or start "
                                         r"afresh with --overwrite$"):
        Runner(cfg, World(), out, quiet=True)
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "interrupted" and f.attrs["rounds_done"] == 3  # left as it was
    assert Runner(cfg, World(), out, quiet=True, overwrite=True).run() == 0  # restarts, as asked


def test_an_unchanged_input_resumes_bit_identical(tmp_path):
    (tmp_path / "steps.txt").write_text("1 2 3 1 2 3 1 2 3 1 2 3")
    cfg = config.from_dict(synthetic_config(rounds=6, train__local_steps_file=str(tmp_path / "steps.txt"),
                                            runtime={"checkpoint_every": 1, "progress": False}))
    full, cut = str(tmp_path / "full.h5"), str(tmp_path / "cut.h5")
    Runner(cfg, World(), full, quiet=True).run()
    _interrupted(cfg, cut)
    (tmp_path / "steps.txt").write_text("1 2 3 1 2 3 1 2 3 1 2 3")  # rewritten with the same content
    Runner(cfg, World(), cut, quiet=True).run()
    _same(full, cut)


# ----------------------------------------------------------------------------- 4: keys that change on resume

def test_what_a_resume_changed_is_stored_and_new_metrics_are_logged_from_then_on(tmp_path):
    """#38 item 4: a new rounds, eval_every or csv took effect but the stored config kept the old
    values; metrics asked for on resume were dropped silently."""
    data = synthetic_config(rounds=6, eval_every=3, evaluation={"train": False},
                            runtime={"checkpoint_every": 1, "progress": False})
    out = str(tmp_path / "r.h5")
    _interrupted(config.from_dict(data), out)
    more = config.from_dict({**data, "rounds": 8, "eval_every": 2,
                             "evaluation": {"train": True, "clients": {"arrays": True}},
                             "runtime": {**data["runtime"], "csv": True}})
    assert Runner(more, World(), out, quiet=True).run() == 0
    with h5py.File(out, "r") as f:
        stored = config.from_stored(f.attrs["config"])
        assert (stored.rounds, stored.eval_every, stored.runtime.csv, stored.evaluation.train) == (8, 2, True, True)
        history = json.loads(f.attrs["config_changes"])
        assert [h["round"] for h in history] == [3] and history[0]["changed"]["eval_every"] == ["3", "2"]
        assert set(history[0]["changed"]) == {"rounds", "eval_every", "evaluation.train",
                                              "evaluation.clients.arrays", "runtime.csv"}
        assert f["metrics/round"][:].tolist() == [0, 3, 4, 6, 8]
        train = f["metrics/train_loss"][:]
        assert np.isnan(train[:2]).all() and np.isfinite(train[2:]).all()  # not evaluated before the resume
        loss = f["clients/loss"][:]
        assert loss.shape == (5, 12) and np.isnan(loss[:2]).all() and np.isfinite(loss[2:]).all()
    assert os.path.exists(tmp_path / "r.csv")


@pytest.mark.parametrize("before", [False, True])
def test_log_availability_changed_on_resume_is_refused(tmp_path, before):
    """The mask of the rounds already run cannot be made up (nor cut short)."""
    data = synthetic_config(rounds=6, runtime={"checkpoint_every": 1, "progress": False,
                                               "log_availability": before})
    out = str(tmp_path / "r.h5")
    _interrupted(config.from_dict(data), out)
    data["runtime"]["log_availability"] = not before
    with pytest.raises(InputError, match=r"^runtime\.log_availability: this run (asks|does not ask) for the "
                                         r"participation mask, but the result file it continues \(after round 3\) "
                                         r"(has none|holds one); keep the setting of its first start"):
        Runner(config.from_dict(data), World(), out, quiet=True)


# ----------------------------------------------------------------------------- #35: extending a completed run

@pytest.mark.parametrize("ranks", [1, pytest.param(2, marks=[pytest.mark.mpi, pytest.mark.slow])])
def test_a_completed_run_extends_to_the_bits_of_a_longer_run(tmp_path, ranks):
    """#35 item 8: a completed run could not be extended without --overwrite (which starts afresh)."""
    data = synthetic_config(rounds=5, eval_every=2, runtime={"progress": False, "log_availability": True},
                            algorithm={"name": "mifa"})  # per-client state: the kept final state must hold it all
    short, ref = str(tmp_path / "short.h5"), str(tmp_path / "ref.h5")

    def run(rounds: int, out: str, alone: bool = False) -> None:
        if ranks == 1 or alone:  # in-process
            Runner(config.from_dict({**data, "rounds": rounds}), World(), out, quiet=True).run()
        else:
            cfg = write_config(tmp_path / "c.yaml", data)
            fedmpi(["run", cfg, "--out", out, "--quiet", "--set", f"rounds={rounds}"], ranks=ranks)

    run(5, short)
    with h5py.File(short, "r") as f:
        assert f["metrics/round"][:].tolist() == [0, 2, 4, 5] and f.attrs["status"] == "completed"
    assert json.load(open(f"{short}.ckpt/manifest.json"))["round"] == 5  # the final state, kept
    run(9, short)
    run(9, ref, alone=True)
    _same(short, ref, mask=True)  # the row of round 5 is gone: a run of 9 rounds evaluates at 0, 2, ..., 8, 9
    with h5py.File(short, "r") as f:
        assert config.from_stored(f.attrs["config"]).rounds == 9
    with pytest.raises(InputError, match="holds a completed run; use --overwrite"):  # 9 is not more
        Runner(config.from_dict({**data, "rounds": 9}), World(), short, quiet=True)


PRIVATE = {"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 0.5}
#: every client once in rounds 0-2, client 0 twice in a row after: over 6 rounds a client's
#: participations are more, and closer, than over 3 (the accountant's epsilon of round 2 differs)
SCHEDULE = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [0, 10], [0, 11], [2, 3]]


def test_extending_is_refused_where_rounds_is_read_or_the_state_is_gone(tmp_path):
    """A trace under privacy reads rounds: the accountant counts each client's participations over
    the run's rounds, so a run of 3 rounds reports epsilon 11.69 at round 2 where a run of 6 reports
    17.86; extending it would keep the rows of the other value."""
    data = synthetic_config(rounds=3, runtime={"progress": False}, algorithm={"name": "fedswe", "max_echo": 2},
                            privacy=PRIVATE, availability={"kind": "trace", "schedule": SCHEDULE})
    out = str(tmp_path / "r.h5")
    Runner(config.from_dict(data), World(), out, quiet=True).run()
    with pytest.raises(InputError, match=r"^rounds: 3 in the run .*r\.h5 holds, 6 now, but availability\.kind trace "
                                         r"counts each client's participations in its replay of the run's rounds "
                                         r"for the privacy accountant, so the rounds run so far belong to the other "
                                         r"value; keep rounds: 3, or start afresh with --overwrite$"):
        Runner(config.from_dict({**data, "rounds": 6}), World(), out, quiet=True)
    plain = {k: v for k, v in data.items() if k != "privacy"}
    Runner(config.from_dict(plain), World(), out, quiet=True, overwrite=True).run()
    os.rename(f"{out}.ckpt", f"{out}.gone")
    with pytest.raises(InputError, match=r"r\.h5: holds a completed run whose final state was not kept"):
        Runner(config.from_dict({**plain, "rounds": 6}), World(), out, quiet=True)
    dropped = {**plain, "runtime": {"progress": False, "keep_final": False}}
    Runner(config.from_dict(dropped), World(), str(tmp_path / "k.h5"), quiet=True).run()
    assert not os.path.exists(tmp_path / "k.h5.ckpt")


def test_a_periodic_kind_under_privacy_extends_to_the_bits_of_a_longer_run(tmp_path):
    """A Bernoulli kind describes its sampling over one period, not the run's rounds: nothing reads
    rounds, so the extension holds the bits (epsilon rows included) of a run of that many rounds."""
    data = synthetic_config(rounds=3, eval_every=1, runtime={"progress": False}, privacy=PRIVATE,
                            algorithm={"name": "fedswe", "max_echo": 2},
                            availability={"kind": "sine", "period": 4, "base": {"kind": "fixed", "values": [0.5]}})
    short, ref = str(tmp_path / "short.h5"), str(tmp_path / "ref.h5")
    Runner(config.from_dict(data), World(), short, quiet=True).run()
    Runner(config.from_dict({**data, "rounds": 6}), World(), short, quiet=True).run()
    Runner(config.from_dict({**data, "rounds": 6}), World(), ref, quiet=True).run()
    _same(short, ref)
    with h5py.File(short) as f:
        assert f["metrics/epsilon"].shape == (7,) and f["privacy/noise_multiplier"].shape == (6,)


@pytest.mark.parametrize("over", [
    {"algorithm": {"name": "fedbuff", "concurrency": 5, "buffer": 3}, "availability": {"kind": "always"},
     "clock": {"kind": "lognormal", "comm_time": 2.0, "sigma": 1.0}},  # tasks in flight at the end
    {"algorithm": {"name": "fedavg_active"}, "clock": {"kind": "lognormal", "deadline": 6.0, "dropout": 0.1}},
], ids=["fedbuff", "deadline"])
def test_a_clocked_run_extends_to_the_bits_of_a_longer_run(tmp_path, over):
    """The virtual clock's state (the asynchronous server's queue, the time) is in the kept final
    state: the extension's metrics (time included), /events and model are those of the longer run."""
    data = synthetic_config(rounds=3, eval_every=1, runtime={"progress": False}, **over)
    short, ref = str(tmp_path / "short.h5"), str(tmp_path / "ref.h5")
    Runner(config.from_dict(data), World(), short, quiet=True).run()
    Runner(config.from_dict({**data, "rounds": 7}), World(), short, quiet=True).run()
    Runner(config.from_dict({**data, "rounds": 7}), World(), ref, quiet=True).run()
    _same(short, ref)
    with h5py.File(short) as a, h5py.File(ref) as b:
        assert a["events/round"].shape[0] > 0 and sorted(a["events"]) == sorted(b["events"])
        for k in a["events"]:
            np.testing.assert_array_equal(a["events"][k][:], b["events"][k][:], err_msg=k)


def test_who_reads_rounds_is_named_by_the_refusal():
    """The readers come from the components' declarations (schema.Reads): privacy under a target
    epsilon, the trace kind under privacy, a plug-in availability kind (given ClientInfo.rounds);
    nothing else, so rounds may change for the rest."""
    from fedmpi import participation
    from fedmpi.registry import AVAILABILITY

    def refusal(data: dict) -> str | None:
        return config.from_dict({**data, "rounds": 6}).reads_changed(config.from_dict({**data, "rounds": 3}))

    calibrated = synthetic_config(algorithm={"name": "fedavg_active"}, availability={"kind": "cohort", "size": 4},
                                  privacy={"mechanism": "gaussian", "clip": 1.0, "epsilon": 8.0, "delta": 1e-5})
    assert refusal(calibrated) == ("rounds: 3 in the run being continued, 6 now, but privacy.mechanism gaussian "
                                   "calibrates the noise to privacy.epsilon over the run's rounds, so the rounds run "
                                   "so far belong to the other value; keep rounds: 3, or start afresh with "
                                   "--overwrite")
    trace = {"kind": "trace", "schedule": SCHEDULE}
    assert "availability.kind trace counts each" in refusal(synthetic_config(availability=trace, privacy=PRIVATE,
                                                                         algorithm={"name": "fedswe", "max_echo": 2}))
    assert refusal(synthetic_config(availability=trace)) is None  # no accountant: the trace only replays
    assert refusal(synthetic_config()) is None
    other = config.from_dict({**calibrated, "seed": 4})  # another experiment too: not the readers' refusal
    assert config.from_dict(calibrated).reads_changed(other) is None

    participation.register("halves")(lambda params, info: participation.Participation(info.m, info.seed))
    try:
        assert "availability.kind halves is a plug-in kind, given the run's rounds (ClientInfo.rounds), so" \
            in refusal(synthetic_config(availability={"kind": "halves"}))
    finally:
        AVAILABILITY._entries.pop("halves", None)
