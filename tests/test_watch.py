"""The watch (fedmpi/runtime/watch.py): heartbeats to a hub name a lost rank and its node, whether
its connection closed or it went silent; after the job, a result file that a killed rank 0 left
``running`` is settled; and a rank frozen mid-run (as on a crashed node: no reset, no word) ends a
real 2-rank run within ``runtime.lost_after_s``, marked ``failed``, exit 5, resumable to the same
bits. On a real two-node Slurm: tests/test_slurm_nodes.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from conftest import ROOT, fedmpi, mpiexec, synthetic_config, wait_for_rows, write_config
from fedmpi.runtime.watch import Heartbeat, Hub, lost_code, settle

SLOW = os.path.join(ROOT, "tests", "slurm", "slow_rounds.py")


def _until(cond, timeout: float = 20.0) -> float:
    start = time.monotonic()
    while not cond():
        assert time.monotonic() - start < timeout, "condition not met in time"
        time.sleep(0.01)
    return time.monotonic() - start


@pytest.fixture
def hub(tmp_path):
    h = Hub(state=str(tmp_path / "state.json")).start()
    yield h
    h.close()


@pytest.fixture
def beat():
    """Heartbeat(...) that is closed at the end of the test (a heartbeat told of a loss ends its
    process STUCK_S later, as a rank stuck in a collective would)."""
    made = []

    def make(*args) -> Heartbeat:
        made.append(Heartbeat(*args))
        return made[-1]

    yield make
    for b in made:
        b.close()


def test_a_closed_connection_is_a_lost_rank_named_with_its_node(hub, beat, tmp_path):
    address = f"127.0.0.1:{hub.port}"
    r0, r1, r2 = (beat(address, r, node, 30) for r, node in ((0, "n1"), (1, "n2"), (2, "n2")))
    r2.close()  # a goodbye: no loss
    time.sleep(0.5)
    assert r0.lost == r1.lost == ""
    r1._sock.close()  # dies without a word (its process was killed)
    _until(lambda: r0.lost)
    assert r0.lost == (f"lost rank 1 (node n2, pid {os.getpid()}): its connection closed without a goodbye "
                       f"(its process or node died)")
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["lost_rank"] == 1 and state["lost_node"] == "n2"


@pytest.mark.slow
def test_a_silent_rank_is_lost_after_lost_after_s(hub, beat):
    r0 = beat(f"127.0.0.1:{hub.port}", 0, "n1", 3)
    mute = socket.create_connection(("127.0.0.1", hub.port))  # says hello, then nothing (a frozen node)
    mute.sendall(b"hello 1 n2 4242 3\n")
    waited = _until(lambda: r0.lost)
    assert r0.lost.startswith("lost rank 1 (node n2, pid 4242): no heartbeat for 3 s")
    assert waited >= 2.5
    mute.close()


def test_a_rank_sees_the_hub_go(hub, beat):
    r1 = beat(f"127.0.0.1:{hub.port}", 1, "n2", 30)
    hub._listen.close()
    for peer in list(hub._peers.values()):  # the hub's process dies: its connections close
        peer.sock.close()
    _until(lambda: r1.lost)
    assert r1.lost.startswith("lost the watch: its connection closed")


def _running_file(path, lost_checkpoint=None) -> None:
    with h5py.File(path, "w") as f:
        f.attrs["status"] = "running"
        if lost_checkpoint is not None:
            f.attrs["lost_checkpoint"] = lost_checkpoint


def test_settle_marks_a_file_whose_rank_0_was_killed(tmp_path):
    out, ckpt = tmp_path / "r.h5", tmp_path / "r.h5.ckpt"
    ckpt.mkdir()
    (ckpt / "manifest.json").write_text(json.dumps({"round": 40}))
    _running_file(out)
    state, exit_file = tmp_path / "state.json", tmp_path / "exit"
    state.write_text(json.dumps({"out": str(out), "checkpoint": str(ckpt),
                                 "lost": "lost rank 1 (node n2, pid 7): its connection closed"}))
    exit_file.write_text("")
    assert settle(str(state), str(exit_file)) == 5
    assert exit_file.read_text() == "5\n"
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "failed" and int(f.attrs["lost_checkpoint"]) == 40
        assert f.attrs["lost"] == ("lost rank 1 (node n2, pid 7): its connection closed; the checkpoint of round 40 "
                                   "is kept")
    assert settle(str(state), str(exit_file)) == 0  # rank 0's (here: the first settle's) code stands


def test_a_loss_that_repeats_at_the_same_checkpoint_is_not_requeued(tmp_path):
    assert lost_code(None, 40) == 5 and lost_code(30, 40) == 5 and lost_code(40, 40) == 1
    assert lost_code(-1, None) == 1 and lost_code(None, None) == 5
    out = tmp_path / "r.h5"
    _running_file(out, lost_checkpoint=-1)
    state, exit_file = tmp_path / "state.json", tmp_path / "exit"
    state.write_text(json.dumps({"out": str(out), "rank0": "rank 0 (node n1, pid 9)"}))
    exit_file.write_text("")
    assert settle(str(state), str(exit_file)) == 1
    with h5py.File(out, "r") as f:
        assert f.attrs["lost"] == ("lost rank 0 (node n1, pid 9): it ended without finishing (killed); no checkpoint "
                                   "yet; lost again before a newer checkpoint: not requeued")


def test_settle_leaves_a_file_that_rank_0_finished_or_still_holds(tmp_path):
    out = tmp_path / "r.h5"
    _running_file(out)
    state, exit_file = tmp_path / "state.json", tmp_path / "exit"
    state.write_text(json.dumps({"out": str(out), "lost": "lost rank 1", "rank0_done": True}))
    exit_file.write_text("")
    assert settle(str(state), str(exit_file)) == 0
    state.write_text(json.dumps({"out": str(out), "lost": "lost rank 1"}))
    import fcntl

    with open(out, "rb") as held:  # a writer still alive holds the claim's lock
        fcntl.flock(held, fcntl.LOCK_EX)
        assert settle(str(state), str(exit_file)) == 0
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "running"


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("launcher", ["mpiexec", "fedmpi-launch"])
def test_a_frozen_rank_fails_the_run_within_lost_after_s_and_the_resume_has_the_same_bits(tmp_path, launcher):
    """Rank 1 stopped (SIGSTOP) mid-run: no reset and no pid gone, the collective would wait
    runtime.timeout_s (an hour here); the heartbeat ends it, rank 0 marks the file and exits 5,
    the checkpoint stays, and the run resumed on one rank gives the uninterrupted run's bits. With
    plain mpiexec rank 0 runs the hub; under fedmpi-launch the launcher does."""
    out = tmp_path / "r.h5"
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(
        output=str(out), rounds=80, eval_every=2,
        runtime={"checkpoint_every": 5, "timeout_s": 3600, "lost_after_s": 3, "progress": False}))
    reference = tmp_path / "ref.h5"
    fedmpi(["run", cfg, "--out", str(reference), "--quiet"])
    env = dict(os.environ, PYTHONPATH=ROOT, FEDMPI_PLUGINS=SLOW, FEDMPI_TEST_ROUND_S="0.1", PYTHON=sys.executable)
    cmd = (mpiexec(2) + [sys.executable, "-m", "fedmpi", "run", cfg, "--quiet"] if launcher == "mpiexec" else
           ["bash", os.path.join(ROOT, "launch", "fedmpi-launch"), "-n", "2", cfg, "--quiet"])
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        wait_for_rows(out, 8)
        rank1 = _rank_pid(proc.pid, 1)
        os.kill(rank1, signal.SIGSTOP)
        _, stderr = proc.communicate(timeout=120)
    finally:
        _kill_session(proc)
    assert proc.returncode == 5, stderr
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "failed"
        lost, kept = f.attrs["lost"], int(f.attrs["lost_checkpoint"])
    assert lost.startswith(f"lost rank 1 (node {socket.gethostname()}, pid {rank1}): no heartbeat for 3 s"), lost
    assert f"the checkpoint of round {kept} is kept" in lost and f"fedmpi: {lost}" in stderr
    assert os.path.exists(f"{out}.ckpt/manifest.json")
    resumed = fedmpi(["run", cfg, "--set", "runtime.progress=true"])
    assert f"resumed from round {kept}/80" in resumed.stderr
    with h5py.File(out, "r") as f, h5py.File(reference, "r") as g:
        assert f.attrs["status"] == "completed" and np.array_equal(f["final/params"][:], g["final/params"][:])


def _rank_pid(root: int, rank: int) -> int:
    """The pid of fedmpi rank ``rank`` among the descendants of ``root`` (its environment says)."""
    deadline = time.time() + 60
    while time.time() < deadline:
        for pid in os.listdir("/proc"):
            if not pid.isdigit():
                continue
            try:
                env = open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
                cmd = open(f"/proc/{pid}/cmdline", "rb").read()
            except OSError:
                continue
            if (f"OMPI_COMM_WORLD_RANK={rank}".encode() in env and b"fedmpi" in cmd and b"python" in cmd
                    and os.getsid(int(pid)) == os.getsid(root)):
                return int(pid)
        time.sleep(0.2)
    raise AssertionError(f"rank {rank} not found")


def _kill_session(proc: subprocess.Popen) -> None:
    """End what is left of the run (the frozen rank, its launcher): the processes of its session."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if int(pid) != os.getpid() and os.getsid(int(pid)) == proc.pid:
                os.kill(int(pid), signal.SIGKILL)
        except OSError:
            pass
    proc.wait(timeout=30)
