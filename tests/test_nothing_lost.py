"""Issue 24, "nothing lost, nothing crashes": each case as a user meets it, through the CLI on
real files (in its own process where it trains, is killed or must not hang; refusals and readers
through ``cli``, in this process). A command never replaces a file it did not make for this run
(unless named with --overwrite), and every failure is one line with a documented exit code."""

from __future__ import annotations

import hashlib
import glob
import os

import h5py
import numpy as np
import pytest

from conftest import cli, fedmpi, synthetic_config, write_config
from fake_results import fake_result


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def _one_line_error(proc, code: int = 2, *words: str) -> str:
    """The command ended with ``code`` and one stderr line (no traceback) holding ``words``."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == code, proc.stderr
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    for w in words:
        assert w in lines[0], lines[0]
    return lines[0]


def _fake(tmp_path, name="a.h5", **over) -> str:
    return fake_result(tmp_path / name, {"round": [0, 10], "test_acc": [0.1, 0.5]}, **over)


# ----------------------------------------------------------------------------- 2: runtime.csv

@pytest.mark.slow
def test_runtime_csv_never_replaces_a_file_it_did_not_write(tmp_path):
    trace = tmp_path / "avail.csv"
    trace.write_text("0 1 2\n3 4\n")
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(
        rounds=2, availability={"kind": "trace", "trace": str(trace)}, runtime__csv=True))
    before = _digest(trace)
    proc = cli(["run", cfg, "--out", str(tmp_path / "avail.h5"), "--quiet"])
    _one_line_error(proc, 2, "runtime.csv", str(trace))
    assert _digest(trace) == before and not os.path.exists(tmp_path / "avail.h5")
    # its own metric CSV is rewritten when the run is overwritten
    cfg = write_config(tmp_path / "a.yaml", synthetic_config(rounds=2, availability={"kind": "always"},
                                                             runtime__csv=True))
    fedmpi(["run", cfg, "--out", str(tmp_path / "r.h5"), "--quiet"])
    fedmpi(["run", cfg, "--out", str(tmp_path / "r.h5"), "--quiet", "--overwrite"])
    assert open(tmp_path / "r.csv").readline().startswith("round,")
    os.unlink(tmp_path / "r.h5")  # a stale metric CSV of a deleted run: replaced only with --overwrite
    proc = cli(["run", cfg, "--out", str(tmp_path / "r.h5"), "--quiet"])
    _one_line_error(proc, 2, "r.csv", "--overwrite")
    fedmpi(["run", cfg, "--out", str(tmp_path / "r.h5"), "--quiet", "--overwrite"])


# ----------------------------------------------------------------------------- 3: export

def test_export_never_replaces_a_result_an_input_or_an_existing_csv(tmp_path):
    a, b = _fake(tmp_path, "a.h5"), _fake(tmp_path, "b.h5", seed=4)
    kept = {p: _digest(p) for p in (a, b)}
    _one_line_error(cli(["export", a, "--csv", "--out", b]), 2, "result file")
    os.symlink(a, tmp_path / "link.csv")
    _one_line_error(cli(["export", a, "--out", str(tmp_path / "link.csv")]), 2, "input")
    _one_line_error(cli(["export", a, "--out", b, "--overwrite"]), 2, "result file")
    assert {p: _digest(p) for p in (a, b)} == kept
    (tmp_path / "a.csv").write_text("my notes\n")
    _one_line_error(cli(["export", a, b]), 2, "a.csv", "--overwrite")
    assert (tmp_path / "a.csv").read_text() == "my notes\n" and not (tmp_path / "b.csv").exists()
    assert cli(["export", a, b, "--overwrite"]).returncode == 0
    assert (tmp_path / "a.csv").read_text().startswith("round,")
    assert not [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]


# ----------------------------------------------------------------------------- 1, 15: disk full

@pytest.fixture
def small_disk(tmp_path):
    """A 4 MB tmpfs (as root); skipped where mounting is not allowed."""
    import subprocess

    disk = tmp_path / "disk"
    disk.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)],
                      capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here (needs root)")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


@pytest.mark.slow
@pytest.mark.parametrize("what", ["mask flush", "checkpoint"])
def test_disk_full_during_a_run_is_one_line_and_resumes(tmp_path, small_disk, what):
    from fault_plugin import env

    over = ({"runtime__log_availability": True, "runtime__flush_s": 0, "runtime__checkpoint_every": 10}
            if what == "mask flush" else {"runtime__flush_s": 3600, "runtime__checkpoint_every": 5})
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(
        rounds=80, eval_every=1, task__clients=2000, task__synthetic__samples=4000, task__partition={"kind": "iid"},
        train__local_steps=1, algorithm={"name": "fedavg_active"}, **over))
    out, pad = small_disk / "r.h5", small_disk / "pad"
    proc = fedmpi(["run", cfg, "--out", str(out), "--quiet"], check=False,
                  env={**env("0:42:fill"), "FEDMPI_TEST_FILL": str(pad)})
    line = _one_line_error(proc, 1, "No space left on device", "resume")
    assert ("cannot write the checkpoint" in line) == (what == "checkpoint"), line
    assert not [f for _, _, files in os.walk(small_disk) for f in files if ".tmp" in f]
    info = cli(["info", str(out), "--no-config"])
    assert info.returncode == 0 and "status:     failed" in info.stdout, info.stderr
    pad.unlink()
    fedmpi(["run", cfg, "--out", str(out), "--quiet"])  # resumes from the checkpoint
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "completed" and list(f["metrics/round"][:]) == list(range(81))
        if what == "mask flush":
            assert f["availability/mask"][:].shape == (80, 2000)


def _no_room(disk) -> None:
    """Fill ``disk`` (a small tmpfs) but for 8 KiB: a file can be created, a result file cannot."""
    from fault_plugin import fill

    pad = disk / "pad"
    fill(str(pad))
    os.truncate(pad, os.path.getsize(pad) - 8192)


def _file_size_limit(nbytes: int):
    """A subprocess's preexec_fn: files larger than ``nbytes`` cannot be written (EFBIG), as on a
    full disk; Python ignores SIGXFSZ."""
    import resource

    return lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))


@pytest.mark.slow
@pytest.mark.parametrize("full", ["tmpfs", "file size limit"])
def test_a_disk_full_while_the_result_file_is_created_is_exit_1_and_leaves_no_stub(tmp_path, full, request):
    """#44 hostile (1): exit 2, and an 800-byte stub the same command then refused for ever as "not
    a fedmpi result file". Now exit 1 (WriteFailed, as on a full disk later on), and nothing left:
    the same command runs once there is room."""
    import subprocess
    import sys

    from conftest import ROOT

    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=2))
    if full == "tmpfs":
        disk = request.getfixturevalue("small_disk")
        _no_room(disk)
        limit = None
    else:
        disk, limit = tmp_path / "out", _file_size_limit(4096)
    out = disk / "r.h5"
    for _ in range(2):  # and again: nothing was left that refuses the next try
        proc = subprocess.run([sys.executable, "-m", "fedmpi", "run", cfg, "--out", str(out), "--quiet"],
                              env=dict(os.environ, PYTHONPATH=ROOT), capture_output=True, text=True, timeout=300,
                              preexec_fn=limit)
        line = _one_line_error(proc, 1, f"{out}: cannot write the result file (", "nothing was run")
        assert ("No space left on device" if full == "tmpfs" else "File too large") in line, line
        assert not out.exists() and not os.path.exists(f"{out}.ckpt")
    if full == "tmpfs":
        (disk / "pad").unlink()
    fedmpi(["run", cfg, "--out", str(out), "--quiet"])
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "completed"


@pytest.mark.slow
def test_a_packed_cell_whose_file_cannot_be_created_runs_once_there_is_room(tmp_path, small_disk):
    """#44 hostile (1): a packed cell stayed failed for ever (its stub refused by every rerun)."""
    s = _sweep(tmp_path, {"rounds": 2}, grid={"seed": [0, 1]}, pack=2)
    data = yamlio_load(s)
    data["out"] = str(small_disk / "out")
    write_config(s, data)
    (small_disk / "out").mkdir()
    _no_room(small_disk)
    proc = fedmpi(["sweep", s, "--quiet"], check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("fedmpi: error:")]
    assert len(errors) == 2 and all("nothing was run" in ln for ln in errors), proc.stderr
    assert os.listdir(small_disk / "out") == []
    (small_disk / "pad").unlink()
    fedmpi(["sweep", s, "--quiet"])
    status = cli(["sweep", s, "--status"])
    assert "2 cells: 2 done" in status.stdout, status.stdout


def yamlio_load(path) -> dict:
    import yaml

    return yaml.safe_load(open(path))


def test_a_flush_that_finds_no_space_writes_nothing(tmp_path, monkeypatch):
    """The stand-in for file systems without a tmpfs: reserving space fails (ENOSPC)."""
    import errno

    from fedmpi.errors import WriteFailed
    from fedmpi.results import hdf5

    path = str(tmp_path / "r.h5")
    w = hdf5.ResultWriter(path, "{}", 0, 1, ["test_acc"], 8, True, claim_=hdf5.claim(path, "d"), flush_s=3600)
    w.append_mask(np.array([1, 2]))
    w.append({"round": 0, "test_acc": 0.5}, 1)
    w.flush()

    def no_space(fd, nbytes):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(hdf5, "reserve", no_space)
    w.append_mask(np.array([3]))
    w.append({"round": 1, "test_acc": 0.6}, 2)
    with pytest.raises(WriteFailed, match="No space left on device"):
        w.flush()
    with pytest.raises(WriteFailed, match="No space left on device"):
        w.finish("completed", np.zeros(3), 2)
    with h5py.File(path, "r") as f:
        assert f.attrs["status"] == "failed" and f["availability/mask"].shape == (1, 8)
        assert list(f["metrics/round"][:]) == [0]


# ----------------------------------------------------------------------------- sweeps: 7, 10, 14, 16, 21

def _sweep(tmp_path, base_over: dict | None = None, **data) -> str:
    write_config(tmp_path / "base.yaml", synthetic_config(**{"rounds": 2, "eval_every": 1, **(base_over or {})}))
    path = tmp_path / "s.sweep.yaml"
    write_config(path, {"base": "base.yaml", "out": str(tmp_path / "out"), **data})
    return str(path)


@pytest.mark.slow
def test_two_sweep_processes_on_one_sweep_both_succeed(tmp_path):
    import subprocess
    import sys

    from conftest import ROOT

    s = _sweep(tmp_path, {"rounds": 1}, grid={"seed": list(range(8))})
    env = dict(os.environ, PYTHONPATH=ROOT)
    procs = [subprocess.Popen([sys.executable, "-m", "fedmpi", "sweep", s, "--quiet"], env=env, cwd=ROOT,
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    for p in procs:
        _, err = p.communicate(timeout=300)
        assert p.returncode == 0, err
    status = cli(["sweep", s, "--status"])
    assert status.returncode == 0 and "8 done" in status.stdout, status.stderr


def test_sweep_size_is_capped_before_cells_are_made(tmp_path):
    s = _sweep(tmp_path, grid={"seed": list(range(1000)), "train.lr": [0.1 * (i + 1) for i in range(1000)]})
    _one_line_error(cli(["sweep", s, "--index", "5"]), 2, "grid", "1000000 cells", "100000")


@pytest.mark.slow
def test_one_cell_and_status_check_only_the_configs_they_need(tmp_path):
    s = _sweep(tmp_path, variants=[{"label": "ok"}, {"label": "bad", "train.lr": -1}], grid={"seed": [0]})
    status = cli(["sweep", s, "--status"])
    assert status.returncode == 0 and "2 cells: 0 done" in status.stdout, status.stderr
    fedmpi(["sweep", s, "--index", "0", "--quiet"])
    _one_line_error(cli(["sweep", s, "--index", "1", "--quiet"]), 2, "train.lr")
    _one_line_error(cli(["sweep", s]), 2, "cell 1", "train.lr")


@pytest.mark.slow
def test_repeated_grid_values_and_dot_labels(tmp_path):
    _one_line_error(cli(["sweep", _sweep(tmp_path, grid={"train.lr": [1, 1.0]}), "--list"]),
                    2, "grid.train.lr", "same value")
    s = _sweep(tmp_path, variants=[{"label": ".."}, {"label": "."}], grid={"seed": [0]})
    listed = cli(["sweep", s, "--list"])
    assert listed.returncode == 0, listed.stderr
    paths = [line.split()[1] for line in listed.stdout.splitlines()]
    out = os.path.realpath(tmp_path / "out")
    assert len(set(paths)) == 2, paths
    assert all(os.path.realpath(p).startswith(out + os.sep) for p in paths), paths
    cfg = write_config(tmp_path / "c.yaml",
                       synthetic_config(rounds=1, name="..", output=str(tmp_path / "runs/{name}/r.h5")))
    fedmpi(["run", cfg, "--quiet"])
    assert not (tmp_path / "r.h5").exists() and (tmp_path / "runs" / "__" / "r.h5").exists()


@pytest.mark.slow
def test_parallel_workers_report_one_bad_input_once(tmp_path):
    trace = tmp_path / "t.txt"
    trace.write_text("0 1 99\n")  # client 99 of 12: refused when each cell sets up
    s = _sweep(tmp_path, {"availability": {"kind": "trace", "trace": str(trace)}}, grid={"seed": [0, 1, 2, 3]})
    proc = fedmpi(["sweep", s, "-j", "2", "--quiet"], check=False)
    assert proc.returncode == 2, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("fedmpi: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr


# ----------------------------------------------------------------------------- 11, 23: --out

@pytest.mark.slow
def test_out_placeholders_are_filled_and_dev_null_is_refused(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=1))
    for seed in (1, 2):
        fedmpi(["run", cfg, "--quiet", "--set", f"seed={seed}",
                "--out", str(tmp_path / "runs/{seed}-{task.clients}.h5")])
    assert sorted(glob.glob("*.h5", root_dir=tmp_path / "runs")) == ["1-12.h5", "2-12.h5"]
    proc = cli(["run", cfg, "--quiet", "--out", str(tmp_path / "{nope}.h5")])
    _one_line_error(proc, 2, "--out", "nope")
    _one_line_error(cli(["run", cfg, "--quiet", "--out", "/dev/null"]), 2, "/dev/null", "regular file")


# ----------------------------------------------------------------------------- table: 5, 8, 18

def _fixed(p: float) -> dict:
    return {"kind": "stationary", "base": {"kind": "fixed", "values": [p] * 12}}


def test_table_groups_by_a_list_valued_key(tmp_path):
    for i, (p, seed) in enumerate([(0.5, 0), (0.5, 1), (0.9, 0)]):
        fake_result(tmp_path / f"r{i}.h5", {"round": [0, 10], "test_acc": [0.1, 0.2 + i]}, seed=seed,
                    availability=_fixed(p))
    proc = cli(["table", str(tmp_path), "--rows", "availability.base.values", "--format", "csv"])
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.splitlines()[1].startswith('"[0.5, 0.5,') and len(out.splitlines()) == 3, out


def test_table_and_info_while_a_run_is_in_set_up(tmp_path):
    from fedmpi.results import hdf5

    done = _fake(tmp_path)
    starting = str(tmp_path / "b.h5")
    c = hdf5.claim(starting, "digest")  # a run holds its (still empty) result file
    try:
        info = cli(["info", starting, "--no-config"])
        assert info.returncode == 0 and "status:     starting" in info.stdout, info.stderr
        proc = cli(["table", str(tmp_path)])
        assert proc.returncode == 0 and "0.5" in proc.stdout and "left out 1 runs" in proc.stderr
        _one_line_error(cli(["table", starting]), 2, "no completed runs", "1 not completed")
    finally:
        c.release()
    assert os.path.getsize(done) > 0


def test_table_bounds_and_odd_numbers(tmp_path):
    fake_result(tmp_path / "a.h5", {"round": [0, 10], "test_acc": [0.1, float("inf")]})
    fake_result(tmp_path / "b.h5", {"round": [0, 10], "test_acc": [0.1, float("-inf")]}, seed=4)
    fake_result(tmp_path / "c.h5", {"round": [0, 10], "test_acc": [float("nan")] * 2}, seed=5, train__lr=0.2)
    proc = cli(["table", str(tmp_path), "--best", "max"])
    assert proc.returncode == 0 and proc.stderr == "" and "nan" in proc.stdout, proc.stderr
    _one_line_error(cli(["table", str(tmp_path), "--digits", "-1"]), 2, "digits")
    _one_line_error(cli(["table", str(tmp_path), "--digits", "100000000"]), 2, "digits")
    os.mkfifo(tmp_path / "x.h5")
    _one_line_error(fedmpi(["table", str(tmp_path)], check=False, timeout=20), 2, "x.h5", "regular file")


# ----------------------------------------------------------------------------- 19: auxiliary commands

def _unbounded(args: list[str], words: list[str]):
    """A case whose refusal is all that stands between the command and endless work or memory: in
    its own process, under a timeout, so that a regression fails the test instead of hanging it."""
    return pytest.param(args, words, True, marks=pytest.mark.slow)


@pytest.mark.parametrize("args, words, own_process", [
    (["pi", "--p", "1e308,1e308,1", "--R", "1", "--json"], None, False),
    _unbounded(["pi", "--p", "uniform:2000000000:0.1:1"], ["--p", "1000000"]),
    _unbounded(["pi", "--p-file", "/dev/zero"], ["/dev/zero", "is a character device"]),
    _unbounded(["markov-plot", "fig1", "--N", "5", "--R", "0:1000000000:1", "--out", "{tmp}/m.png"], ["--R", "0..4"]),
    _unbounded(["availability", "{cfg}", "--rounds", "1000000000000"], ["--rounds", "100000"]),
    (["availability", "{cfg}", "--out", "{tmp}/x.yaml"], ["--out", ".png"], False),
    (["availability", "{cfg}", "--out", "{cfg}"], ["--out"], False),
])
def test_auxiliary_commands_are_bounded(tmp_path, args, words, own_process):
    cfg = write_config(tmp_path / "c.png", synthetic_config())  # a config that a figure path could hit
    args = [a.format(tmp=tmp_path, cfg=cfg) for a in args]
    before = _digest(cfg)
    proc = fedmpi(args, check=False, timeout=60) if own_process else cli(args)
    if words is None:
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        import json

        pi = json.loads(proc.stdout)["pi"]
        assert pi[0] == pytest.approx(0.5, abs=0.02) and pi[2] < 1e-300
    else:
        _one_line_error(proc, 2, *words)
    assert _digest(cfg) == before


@pytest.mark.slow
def test_a_damaged_mask_is_one_line_for_readers_and_resume(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(
        rounds=4, eval_every=1, runtime__log_availability=True, runtime__checkpoint_every=2))
    out = str(tmp_path / "r.h5")
    from fault_plugin import env

    fedmpi(["run", cfg, "--out", out, "--quiet"], check=False, env=env("0:3:raise"))
    with h5py.File(out, "r") as f:
        offset, size = (lambda i: (i.byte_offset, i.size))(f["availability/mask"].id.get_chunk_info(0))
    with open(out, "r+b") as fh:
        fh.seek(offset)
        fh.write(b"\xff" * size)
    _one_line_error(cli(["markov-plot", "freq", out, "--out", str(tmp_path / "f.png")]),
                    2, "/availability/mask is damaged")
    _one_line_error(cli(["run", cfg, "--out", out, "--quiet"]), 2, "mask is damaged", "--overwrite")


# ----------------------------------------------------------------------------- 12: long strings

def _long_string_bomb(n_aliases: int = 100) -> str:
    return "a: &x '" + "y" * (1 << 20) + "'\nb: [" + ", ".join(["*x"] * n_aliases) + "]\n"


def test_long_strings_count_against_the_alias_budget(tmp_path):
    s = tmp_path / "s.sweep.yaml"
    s.write_text(_long_string_bomb())
    _one_line_error(cli(["table", str(s)]), 2, "aliases are expanded")
    path = _fake(tmp_path)
    with h5py.File(path, "a") as f:
        f.attrs["config"] = _long_string_bomb()
    with h5py.File(path, "a") as f:
        f.attrs["status"] = "running"  # an unfinished run at the output path: claim reads its config
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=1))
    _one_line_error(cli(["run", cfg, "--out", path, "--quiet"]), 2, "another experiment")
    for cmd in (["info", path, "--no-config"], ["table", path], ["export", path, "--out", "-"]):
        proc = cli(cmd)
        assert proc.returncode in (0, 2) and "Traceback" not in proc.stderr, proc.stderr
        assert len(proc.stdout) < 1 << 20


# ----------------------------------------------------------------------------- 13: IDX memory

def _idx_run(tmp_path, root) -> tuple:
    """``fedmpi run`` on the IDX files in ``root``: (the process, its peak RSS in KiB)."""
    import subprocess
    import sys

    from conftest import ROOT

    cfg = write_config(tmp_path / "c.yaml", synthetic_config(
        rounds=1, task={"dataset": "fmnist", "root": str(root), "clients": 4, "model": "logreg"}))
    proc = subprocess.Popen([sys.executable, "-m", "fedmpi", "run", cfg, "--out", str(tmp_path / "r.h5"), "--quiet"],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, PYTHONPATH=ROOT, FEDMPI_CACHE=str(tmp_path / "cache")))
    err = proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode, proc.stderr = os.waitstatus_to_exitcode(status), err
    return proc, usage.ru_maxrss


@pytest.mark.slow
@pytest.mark.parametrize("lie", ["labels", "size"])
def test_an_idx_header_that_lies_is_refused_before_inflating(tmp_path, lie):
    """300000 images (235 MB inflated, 230 KB as gzip) with 12 labels, or a header announcing
    them over 1 MB of data: refused before any image is inflated, at the peak memory of a run
    refused for 13 labels of 12 tiny images (it was that plus twice the images)."""
    import gzip
    import struct
    import zlib

    from test_readers import write_idx

    small = tmp_path / "small"
    write_idx(small, np.random.default_rng(0))
    (small / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(bytes([0, 0, 8, 1]) + struct.pack(">I", 13)
                                                                     + bytes(13)))
    _, baseline = _idx_run(tmp_path, small)
    root = tmp_path / "fm"
    write_idx(root, np.random.default_rng(0))
    n, data = 300_000, 300_000 * 784 if lie == "labels" else 1 << 20
    with open(root / "train-images-idx3-ubyte.gz", "wb") as fh:
        z = zlib.compressobj(1, zlib.DEFLATED, 31)
        fh.write(z.compress(bytes([0, 0, 8, 3]) + struct.pack(">3I", n, 28, 28)))
        for lo in range(0, data, 1 << 20):
            fh.write(z.compress(bytes(min(1 << 20, data - lo))))
        fh.write(z.flush())
    if lie == "size":
        (root / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(
            bytes([0, 0, 8, 1]) + struct.pack(">I", n) + bytes(n)))
    proc, peak = _idx_run(tmp_path, root)
    _one_line_error(proc, 2, "train-images-idx3-ubyte.gz", "12 labels" if lie == "labels" else "truncated")
    assert peak < baseline + 100 * 1024, (peak, baseline)  # KiB; the images alone are 235 MB


# ----------------------------------------------------------------------------- 17: dirichlet repair

def _fill_empty_reference(owner, pools, m):
    """The repair as it was (quadratic): the same donors, the same samples."""
    counts = np.bincount(owner[owner >= 0], minlength=m)
    for pool in pools:
        for i in pool[counts[pool] == 0]:
            donor = pool[np.argmax(counts[pool])]
            s = np.flatnonzero(owner == donor)[-1]
            owner[s] = i
            counts[donor] -= 1
            counts[i] += 1


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_dirichlet_repair_is_fast_and_gives_the_same_clients(seed):
    import importlib
    import time

    from fedmpi.config import PartitionConfig

    part = importlib.import_module("fedmpi.data.partition")  # (fedmpi.data.partition is also a function)

    gen = np.random.default_rng(seed)
    m = int(gen.integers(5, 300))
    owner = gen.integers(-1, m // 3 + 1, 3 * m)  # most clients empty, a few unowned samples
    pools = [np.arange(m)] if seed % 2 else [np.arange(0, m, 2), np.arange(1, m, 2)]
    mine, ref = owner.copy(), owner.copy()
    _fill_empty_reference(ref, pools, m)
    part._fill_empty(mine, pools, m, "dirichlet")
    assert np.array_equal(mine, ref)
    if seed == 0:  # 300000 clients, about one sample each: minutes before
        labels = np.random.default_rng(0).integers(0, 10, 330_000)
        start = time.perf_counter()
        part.partition(labels, 300_000, PartitionConfig(kind="dirichlet", alpha=0.5), np.random.default_rng(1))
        assert time.perf_counter() - start < 20


# ----------------------------------------------------------------------------- 20: a stopped peer

@pytest.mark.slow
@pytest.mark.mpi
def test_a_stopped_peer_is_one_lost_contact_line(tmp_path):
    from fault_plugin import env

    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=20, runtime__timeout_s=5))
    proc = fedmpi(["run", cfg, "--out", str(tmp_path / "r.h5"), "--quiet"], ranks=2, check=False, timeout=120,
                  env=env("1:3:stop"))
    assert proc.returncode != 0
    ours = [ln for ln in proc.stderr.splitlines() if ln.startswith("fedmpi:")]  # (not Open MPI's box)
    assert "Traceback" not in proc.stderr and "rank 0: lost contact" in ours[0], proc.stderr
    assert all("lost contact with another rank" in ln for ln in ours), proc.stderr  # one per rank at most


# ----------------------------------------------------------------------------- 25: forged checkpoints

@pytest.mark.slow
@pytest.mark.parametrize("forge, words", [
    ("dtype", ["dtype torch.float64"]),
    ("key", ["algorithm/shared/extra", "not part of"]),
    ("nan", ["NaN"]),
])
def test_a_resealed_edited_checkpoint_is_refused(tmp_path, forge, words):
    import json

    import torch
    from fault_plugin import env

    from fedmpi import checkpoint

    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=8, runtime__checkpoint_every=2,
                                                             algorithm={"name": "mifa"}))
    out = str(tmp_path / "r.h5")
    fedmpi(["run", cfg, "--out", out, "--quiet"], check=False, env=env("0:5:raise"))
    folder = checkpoint.folder_for(out)
    man = json.load(open(os.path.join(folder, checkpoint.MANIFEST)))
    shard = os.path.join(folder, man["shards"][0]["file"])
    state = torch.load(shard, weights_only=True)
    name = next(k for k, v in state.items() if k.startswith("algorithm/") and v.is_floating_point())
    if forge == "dtype":
        state[name] = state[name].double()
    elif forge == "key":
        state["algorithm/shared/extra"] = torch.zeros(3)
    else:
        state[name] = state[name].clone().fill_(float("nan"))
    torch.save(state, shard)
    man["shards"][0]["sha256"] = hashlib.sha256(open(shard, "rb").read()).hexdigest()
    man["manifest_sha256"] = checkpoint._manifest_sha256(man)
    with open(os.path.join(folder, checkpoint.MANIFEST), "w") as fh:
        json.dump(man, fh)
    _one_line_error(cli(["run", cfg, "--out", out, "--quiet"]), 2, "manifest.json", *words)


def test_run_plot_path_is_checked_before_the_run(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=1))
    (tmp_path / "notes.png").write_text("not a figure")
    for bad, words in (("notes.png", ["--plot", "already exists"]), ("fig.txt", ["--plot", ".png"])):
        proc = cli(["run", cfg, "--out", str(tmp_path / "r.h5"), "--quiet", "--plot", str(tmp_path / bad)])
        _one_line_error(proc, 2, *words)
        assert not (tmp_path / "r.h5").exists()
    assert (tmp_path / "notes.png").read_text() == "not a figure"
