"""Checkpoint/resume: killed or preempted runs continue to the same numbers, on any rank count."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch

import fault_plugin
from conftest import wait_for_rows, ROOT, cli, fedmpi, synthetic_config, write_config
from fedmpi import checkpoint
from fedmpi.errors import InputError
from fedmpi.runtime import World
from fedmpi.state import State


def ck_config(tmp_path, rounds=30, **over):
    return write_config(tmp_path / "c.yaml", synthetic_config(
        rounds=rounds, eval_every=3, runtime={"checkpoint_every": 4, "progress": False, "log_availability": True},
        **over))


def same(a: str, b: str) -> None:
    with h5py.File(a, "r") as fa, h5py.File(b, "r") as fb:
        for k in fa["metrics"]:
            if k not in ("wall_time", "peak_rss_mb"):
                assert np.array_equal(fa["metrics"][k][:], fb["metrics"][k][:]), k
        assert np.array_equal(fa["final/params"][:], fb["final/params"][:])
        assert np.array_equal(fa["availability/mask"][:], fb["availability/mask"][:])
        assert fb.attrs["status"] == "completed"


@pytest.mark.slow
def test_kill9_then_resume_is_bit_identical(tmp_path):
    cfg = ck_config(tmp_path)
    full, cut = str(tmp_path / "full.h5"), str(tmp_path / "cut.h5")
    fedmpi(["run", cfg, "--out", full, "--quiet"])
    # a random round right after a checkpoint that follows the last evaluation (checkpoints every
    # 4 rounds, evaluations every 3): rows written since the last flush must not be lost
    kill_at = int(os.environ.get("FEDMPI_TEST_KILL_AT", np.random.default_rng().choice([8, 16, 20, 28])))
    p = fedmpi(["run", cfg, "--out", cut, "--quiet"], check=False, env=fault_plugin.env(f"0:{kill_at}:kill"))
    assert p.returncode == -signal.SIGKILL
    with h5py.File(cut, "r") as f:
        assert f.attrs["status"] == "running"
    man = json.load(open(cut + ".ckpt/manifest.json"))
    assert man["round"] == kill_at // 4 * 4
    fedmpi(["run", cfg, "--out", cut, "--quiet"])  # the same command resumes by itself
    same(full, cut)
    man = json.load(open(cut + ".ckpt/manifest.json"))  # only the final state is kept (to extend the run)
    assert man["round"] == 30 and sorted(os.listdir(cut + ".ckpt")) == ["manifest.json", "round-00000030"]


@pytest.mark.slow
@pytest.mark.mpi
def test_sigterm_exit3_then_resume_on_two_ranks(tmp_path):
    cfg = ck_config(tmp_path, rounds=3000)
    full, cut = str(tmp_path / "full.h5"), str(tmp_path / "cut.h5")
    proc = subprocess.Popen([sys.executable, "-m", "fedmpi", "run", cfg, "--out", cut, "--quiet"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_rows(cut, 3)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 3, err
    assert "interrupted: signal SIGTERM" in err and "Traceback" not in err
    with h5py.File(cut, "r") as f:
        assert f.attrs["status"] == "interrupted"
        stopped = int(f.attrs["rounds_done"])
    # finish a shorter run: the interrupted one continues to the same numbers on 2 ranks
    rounds = stopped + 7
    fedmpi(["run", cfg, "--out", full, "--quiet", "--set", f"rounds={rounds}"])
    fedmpi(["run", cfg, "--out", cut, "--quiet", "--resume", "--set", f"rounds={rounds}"], ranks=2)
    same(full, cut)
    with h5py.File(cut, "r") as f:
        assert f.attrs["world_size"] == 2


@pytest.mark.slow
def test_resume_errors(tmp_path):
    cfg = ck_config(tmp_path, rounds=9)
    out = str(tmp_path / "r.h5")
    p = cli(["run", cfg, "--out", out, "--resume"])
    assert p.returncode == 2 and "--resume: no checkpoint at" in p.stderr
    fedmpi(["run", cfg, "--out", out, "--quiet", "--set", "rounds=9"],
           check=False, env=fault_plugin.env("0:6:kill"))
    p = cli(["run", cfg, "--out", out, "--set", "train.lr=0.3"])  # the result file refuses first
    assert p.returncode == 2 and "run of another experiment" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    os.rename(out, out + ".keep")  # without the result file, the checkpoint itself refuses
    p = cli(["run", cfg, "--out", out, "--set", "train.lr=0.3"])
    assert p.returncode == 2 and "different config" in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not os.path.exists(out)  # and no empty file is left behind
    os.rename(out + ".keep", out)
    with open(out + ".ckpt/manifest.json", "w") as fh:
        fh.write("{not json")
    p = cli(["run", cfg, "--out", out])
    assert p.returncode == 2 and "corrupt checkpoint manifest" in p.stderr


@pytest.mark.slow
def test_a_run_begun_with_train_global_lr_resumes_with_algorithm_global_lr(tmp_path):
    """eta_g moved from train.global_lr to algorithm.global_lr (#23): a run whose result file and
    checkpoint were written with the old key resumes with the new one when the value is the same,
    to the same numbers, and is another experiment when it is not."""
    import yaml

    def cfg(name: str, **key) -> str:
        return write_config(tmp_path / name, synthetic_config(
            rounds=12, eval_every=3, runtime={"checkpoint_every": 4, "progress": False, "log_availability": True},
            **key))

    old, new = cfg("old.yaml", train__global_lr=0.5), cfg("new.yaml", algorithm__global_lr=0.5)
    full, cut = str(tmp_path / "full.h5"), str(tmp_path / "cut.h5")
    fedmpi(["run", new, "--out", full, "--quiet"])
    p = fedmpi(["run", old, "--out", cut, "--quiet"], check=False, env=fault_plugin.env("0:6:kill"))
    assert p.returncode == -signal.SIGKILL and json.load(open(cut + ".ckpt/manifest.json"))["round"] == 4
    with h5py.File(cut, "r+") as f:  # the config as fedmpi stored it before the move
        stored = yaml.safe_load(f.attrs["config"])
        stored["train"]["global_lr"] = stored["algorithm"].pop("global_lr")
        f.attrs["config"] = yaml.safe_dump(stored, sort_keys=False)
    p = cli(["run", new, "--out", cut, "--set", "algorithm.global_lr=0.25"])
    assert p.returncode == 2 and "another experiment (differs in algorithm.global_lr)" in p.stderr
    os.rename(cut, cut + ".keep")  # the checkpoint alone names the new key too
    p = cli(["run", new, "--out", cut, "--set", "algorithm.global_lr=0.25"])
    assert p.returncode == 2 and "different config" in p.stderr and "algorithm.global_lr" in p.stderr, p.stderr
    os.rename(cut + ".keep", cut)
    p = fedmpi(["run", new, "--out", cut, "--quiet"])
    assert "notice" not in p.stderr
    same(full, cut)


def test_resharding_client_rows(tmp_path):
    """A checkpoint written by 1 rank loads as the right slices on 3 ranks (and the union/ entries everywhere)."""
    folder = str(tmp_path / "ck")
    m = 10
    rows = torch.arange(m * 2, dtype=torch.float32).view(m, 2)
    state = State(shared={"x": torch.zeros(2)}, clients={"table": rows}, union={"version/3": torch.ones(2)})
    checkpoint.save(World(), folder, 12, "abc", m, {"algorithm": state})
    got = []
    for r in range(3):
        rounds, parts = checkpoint.load(World(rank=r, size=3), folder, "abc", m)
        st = parts["algorithm"]
        lo, hi = World(rank=r, size=3).shard(m)
        assert rounds == 12 and torch.equal(st.clients["table"], rows[lo:hi])
        assert torch.equal(st.union["version/3"], torch.ones(2)) and torch.equal(st.shared["x"], torch.zeros(2))
        got.append(st.clients["table"])
    assert torch.equal(torch.cat(got), rows)
    with pytest.raises(InputError, match="different config"):
        checkpoint.load(World(), folder, "other", m)
    shard = os.path.join(folder, "round-00000012", "shard-00000.pt")
    with open(shard, "r+b") as fh:
        fh.seek(10)
        fh.write(b"XXXX")
    with pytest.raises(InputError, match="missing or corrupt"):
        checkpoint.load(World(), folder, "abc", m)


# ----------------------------------------------------------------------------- manifest integrity

def _saved(tmp_path, m=10, rounds=12):
    folder = str(tmp_path / "ck")
    state = State(shared={"x": torch.zeros(2)}, clients={"table": torch.arange(m * 2, dtype=torch.float32).view(m, 2)})
    checkpoint.save(World(), folder, rounds, "abc", m, {"algorithm": state})
    return folder, os.path.join(folder, "manifest.json")


def _rewrite(path, man, reseal=True):
    if reseal:  # a manifest whose checksum was recomputed: the schema must still catch it
        man["manifest_sha256"] = checkpoint._manifest_sha256(man)
    with open(path, "w") as fh:
        json.dump(man, fh)


@pytest.mark.parametrize("edit, field", [
    ({"round": 9999}, "manifest_sha256: does not match"), ({"round": -5}, "round: must be in [0, 2^62)"),
    ({"m": 11}, "manifest_sha256: does not match"), ({"config_digest": "abc "}, "manifest_sha256: does not match")])
def test_edited_manifest_fields_are_refused(tmp_path, edit, field):
    """An edited round gave exit 0 and a silently wrong result (the checksum covered only the shards)."""
    folder, path = _saved(tmp_path)
    man = json.load(open(path))
    man.update(edit)
    _rewrite(path, man, reseal=False)
    with pytest.raises(InputError) as e:
        checkpoint.load(World(), folder, "abc", 10)
    assert str(e.value).startswith(f"{path}: checkpoint manifest field {field}"), str(e.value)


@pytest.mark.parametrize("change, field", [
    (lambda man: man["shards"][0].pop("file"), "shards[0].file: missing"),
    (lambda man: man["shards"][0].update(lo="0"), "shards[0].lo: must be an integer"),
    (lambda man: man.update(shards=[1, 2]), "shards: 2 entries for world_size 1"),
    (lambda man: man.update(shards=[1], world_size=1), "shards[0].: must be an object"),
    (lambda man: man.update(round=-5), "round: must be in [0, 2^62)"),
    (lambda man: man.update(round=True), "round: must be an integer"),
    (lambda man: man.update(extra=1), "extra: unknown field"),
    (lambda man: man.pop("config_digest"), "config_digest: missing"),
    (lambda man: man["shards"][0].update(hi=7), "shards[0].hi: the shards end at client 7, not m = 10"),
    (lambda man: man["shards"][0].update(hi=11), "shards[0].hi: must be in [0, m = 10]"),
    (lambda man: man["shards"][0].update(file="../../etc/passwd"), "shards[0].file: must be 'round-00000012/"),
    (lambda man: man["shards"][0].update(sha256="xyz"), "shards[0].sha256: must be 64 hex digits"),
    (lambda man: man["shards"][0].update(rank=3), "shards[0].rank: must be 0"),
])
def test_manifest_schema(tmp_path, change, field):
    folder, path = _saved(tmp_path)
    man = json.load(open(path))
    change(man)
    _rewrite(path, man)
    with pytest.raises(InputError) as e:
        checkpoint.load(World(), folder, "abc", 10)
    msg = str(e.value)
    assert msg.startswith(f"{path}: checkpoint manifest field {field}") and "\n" not in msg, msg


def test_manifest_checksum_missing_or_not_json(tmp_path):
    folder, path = _saved(tmp_path)
    man = json.load(open(path))
    del man["manifest_sha256"]
    _rewrite(path, man, reseal=False)
    with pytest.raises(InputError, match="field manifest_sha256: missing"):
        checkpoint.load(World(), folder, "abc", 10)
    with open(path, "w") as fh:
        fh.write("[" * 10000 + "]" * 10000)
    with pytest.raises(InputError, match="corrupt checkpoint manifest: JSON nested 10000 levels deep"):
        checkpoint.load(World(), folder, "abc", 10)


def _replace_shard(folder, path, tensors):
    """A shard with other content whose hash the manifest agrees with (checksums recomputed)."""
    shard = os.path.join(folder, "round-00000012", "shard-00000.pt")
    torch.save(tensors, shard)
    man = json.load(open(path))
    man["shards"][0]["sha256"] = checkpoint._sha256(shard)
    _rewrite(path, man)
    return shard


@pytest.mark.parametrize("tensors, msg", [
    ({"algorithm/client/table": torch.zeros(7, 2), "algorithm/shared/x": torch.zeros(2)},
     "key algorithm/client/table: 7 rows, the manifest's client range [0, 10) has 10"),
    ({"algorithm/client/table": torch.tensor(1.0)}, "key algorithm/client/table: a scalar"),
    ({"algorithm/client/table": 5}, "checkpoint shards hold only named tensors"),
    ([torch.zeros(3)], "not a mapping of tensors"),
])
def test_shard_rows_checked_against_manifest(tmp_path, tensors, msg):
    """A shard with a matching hash but the wrong row count ended in an IndexError traceback."""
    folder, path = _saved(tmp_path)
    shard = _replace_shard(folder, path, tensors)
    with pytest.raises(InputError) as e:
        checkpoint.load(World(), folder, "abc", 10)
    assert str(e.value).startswith(f"{shard}: ") and msg in str(e.value), str(e.value)


def test_shards_must_agree_on_client_keys(tmp_path):
    folder = str(tmp_path / "ck")
    for r in range(2):  # two ranks' shards written one after the other (allgather of a 1-rank world)
        w = World(rank=r, size=2)
        lo, hi = w.shard(10)
        state = {"algorithm/client/a": torch.zeros(hi - lo, 3)}
        if r == 0:
            state["algorithm/client/b"] = torch.zeros(hi - lo)
        sub = os.path.join(folder, "round-00000012")
        os.makedirs(sub, exist_ok=True)
        torch.save(state, os.path.join(sub, f"shard-{r:05d}.pt"))
    shards = [{"rank": r, "lo": World(rank=r, size=2).shard(10)[0], "hi": World(rank=r, size=2).shard(10)[1],
               "file": f"round-00000012/shard-{r:05d}.pt",
               "sha256": checkpoint._sha256(os.path.join(folder, f"round-00000012/shard-{r:05d}.pt"))}
              for r in range(2)]
    man = {"round": 12, "config_digest": "abc", "world_size": 2, "m": 10, "fedmpi_version": "x", "shards": shards}
    _rewrite(os.path.join(folder, "manifest.json"), man)
    with pytest.raises(InputError, match=r"shard-00001.pt: key algorithm/client/b: missing, or rows of another shape"):
        checkpoint.load(World(), folder, "abc", 10)


def test_checkpoint_beyond_rounds_is_refused(tmp_path):
    folder, _ = _saved(tmp_path)
    assert checkpoint.load(World(), folder, "abc", 10, rounds=12)[0] == 12
    with pytest.raises(InputError, match="checkpoint is at round 12, beyond rounds = 11"):
        checkpoint.load(World(), folder, "abc", 10, rounds=11)


def test_stale_temporary_files_cleaned_at_next_checkpoint(tmp_path):
    """kill -9 during a write left *.tmp-PID files in .ckpt/ for ever."""
    folder, _ = _saved(tmp_path)
    stale = [os.path.join(folder, "manifest.json.tmp-424242"),
             os.path.join(folder, "round-00000016", "shard-00000.pt.tmp-424242"),
             os.path.join(folder, "round-00000012", "shard-00000.pt.tmp-1")]
    for p in stale:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        open(p, "wb").write(b"partial")
    keep = os.path.join(folder, "notes.txt")
    open(keep, "w").write("mine")
    checkpoint.save(World(), folder, 16, "abc", 10, {"algorithm": State(clients={"table": torch.zeros(10, 2)})})
    assert not any(os.path.exists(p) for p in stale) and os.path.exists(keep)
    assert sorted(os.listdir(folder)) == ["manifest.json", "notes.txt", "round-00000016"]
    assert checkpoint.load(World(), folder, "abc", 10)[0] == 16


@pytest.mark.slow
def test_edited_round_through_the_cli(tmp_path):
    """The campaign's case end to end: "round": 9999 in a real run's manifest is exit 2, one line."""
    cfg = ck_config(tmp_path, rounds=9)
    out = str(tmp_path / "r.h5")
    fedmpi(["run", cfg, "--out", out, "--quiet"], check=False, env=fault_plugin.env("0:6:kill"))
    path = out + ".ckpt/manifest.json"
    man = json.load(open(path))
    man["round"] = 9999
    json.dump(man, open(path, "w"))
    p = cli(["run", cfg, "--out", out])
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert f"{path}: checkpoint manifest field manifest_sha256" in p.stderr
