"""fedmpi across the two nodes of the tests' Slurm (tests/slurm/cluster.sh: n1 and n2, two slurmd
on this machine): the multi-node template with one rank per node, a node lost mid-run (killed, and
frozen as a crashed machine goes silent), and a node-local output folder refused.

Marked ``slurm`` like tests/test_slurm_cluster.py, whose fixtures they share. A test that takes a
node down brings it back (``revive``) before it ends, also when it fails.
"""

from __future__ import annotations

import os
import re
import subprocess
import time

import h5py
import numpy as np
import pytest

import test_slurm_cluster as one_node
from conftest import wait_for_rows
from test_slurm_cluster import CLUSTER, Jobs, _params, _reference

cluster, job = one_node.cluster, one_node.job  # the same fixtures (the session's cluster)

pytestmark = pytest.mark.slurm
ONE_PER_NODE = ("--gpus-per-node=0", "--ntasks-per-node=1")
KILL_ONCE = os.path.join(os.path.dirname(CLUSTER), "kill_once.py")


@pytest.fixture
def nodes(job: Jobs):
    """Node control for a test that takes one down: yields ``act(verb, node)``; every node it took
    down is revived at the end."""
    taken: set[str] = set()

    def act(verb: str, node: str) -> None:
        p = job.run("bash", CLUSTER, verb, node, timeout=300)  # revive: up to a minute (cluster.sh)
        assert p.returncode == 0, p.stderr
        (taken.discard if verb == "revive" else taken.add)(node)

    yield act
    for node in sorted(taken):
        p = job.run("bash", CLUSTER, "revive", node, timeout=300)
        assert p.returncode == 0, f"node {node} did not come back: {p.stderr}"


def _submit(job: Jobs, cfg: str, out: str, *opts: str, round_s: float = 0.0) -> str:
    return job.sbatch("multi_node.sbatch", cfg, "--out", out, "--set", "runtime.device=cpu",
                      opts=("--nodes=2", *ONE_PER_NODE, *opts), round_s=round_s, ranks=2)


def _attrs(path) -> dict:
    with h5py.File(path, "r", locking=False) as f:
        return {k: f.attrs[k] for k in f.attrs if k != "config"}


def _wait_status(path, status: str, timeout: float) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            attrs = _attrs(path)
            if attrs["status"] == status:
                return attrs
        except (OSError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"{path}: not {status} after {timeout} s: {_attrs(path)}")


def _wait_idle(job: Jobs, timeout: float = 180) -> None:
    """Until both nodes are idle (an earlier test's job may still be ending on one)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        if job.run("sinfo", "-h", "-o", "%T %D").stdout.split() == ["idle", "2"]:
            return
        time.sleep(0.5)
    raise AssertionError(f"the nodes are not both idle: {job.run('sinfo').stdout}")


def _wait_restarts(job: Jobs, job_id: str, n: int, timeout: float = 180) -> None:
    deadline = time.time() + timeout
    while job.restarts(job_id) < n and time.time() < deadline:
        time.sleep(0.5)
    assert job.restarts(job_id) >= n, job.show(job_id) | {"log": job.log(job_id)}


def test_multi_node_template_one_rank_per_node_gives_the_one_rank_bits(job):
    cfg = job.config(rounds=8)
    job_id = _submit(job, cfg, "runs/m.h5")
    info = job.wait(job_id)
    log = job.log(job_id)
    assert info["JobState"] == "COMPLETED" and info["NodeList"] == "n[1-2]", log
    assert "fedmpi: 2 ranks on 2 nodes: n1 (rank 0), n2 (rank 1)" in log, log
    assert re.search(r"fedmpi: round 8/8 ", log) and "fedmpi: wrote runs/m.h5" in log, log
    assert int(_attrs(job.repo / "runs" / "m.h5")["world_size"]) == 2
    assert np.array_equal(_params(job.repo / "runs" / "m.h5"), _reference(job, cfg))


def test_a_killed_node_fails_the_run_naming_it_and_the_job_requeues_to_the_same_bits(job, nodes):
    """n2 killed (its slurmd, stepd and rank: SIGKILL): this machine's kernel resets rank 1's
    connections, Open MPI aborts rank 0 (exit 14) before any Python code runs, and the watch in
    fedmpi-launch marks the file, naming rank 1 and n2; job.sh waits until Slurm declares n2 down,
    and the job is requeued; once n2 is back, the rerun resumes. Rank 1 of the rerun is killed
    once more at round 55 (n2 lives on): a loss after a newer checkpoint (50) than at the first
    one is requeued again, and the third start resumes to the uninterrupted run's bits."""
    cfg = job.config(rounds=100, runtime={"checkpoint_every": 10, "progress": True, "timeout_s": 3600})
    reference = _reference(job, cfg)
    out = job.repo / "runs" / "k.h5"
    job.env.update(FEDMPI_PLUGINS=os.pathsep.join([job.env["FEDMPI_PLUGINS"], KILL_ONCE]),
                   FEDMPI_TEST_KILL_ONCE=f"1:55:{job.repo / 'killed-once'}")
    job_id = _submit(job, cfg, "runs/k.h5", round_s=0.2)
    wait_for_rows(out, 16, timeout=180)
    nodes("crash", "n2")
    attrs = _wait_status(out, "failed", timeout=120)  # not runtime.timeout_s (an hour): the watch saw it
    assert re.match(r"lost rank 1 \(node n2, pid \d+\): its connection closed", attrs["lost"]), attrs
    kept = int(attrs["lost_checkpoint"])
    assert f"the checkpoint of round {kept} is kept" in attrs["lost"] and kept >= 20
    assert os.path.exists(f"{out}.ckpt/round-{kept:08d}")
    _wait_restarts(job, job_id, 1)
    log = job.log(job_id)
    assert "fedmpi: lost rank 1 (node n2" in log and "marked failed; resumable from round" in log, log
    nodes("revive", "n2")
    info = job.wait(job_id, timeout=300)
    log = job.log(job_id)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0" and int(info["Restarts"]) >= 2, log
    assert f"resumed from round {kept}/100" in log and "resumed from round 50/100" in log, log
    assert np.array_equal(_params(out), reference)
    with h5py.File(out, "r") as f:  # what happened stays in the file
        assert f.attrs["lost"].startswith("lost rank 1 (node n2") and int(f.attrs["world_size"]) == 2


def test_a_frozen_node_is_lost_by_heartbeat_and_the_rerun_takes_the_nodes_left(job, nodes):
    """n2 frozen (SIGSTOP: no reset, no word, as a crashed machine): rank 0 learns from the watch
    within runtime.lost_after_s, marks the file itself and exits 5; job.sh waits for Slurm to
    declare n2 down, and the job, asking for --nodes=1-2 with one rank per node, is requeued and
    resumes on n1 alone, one rank, to the same bits."""
    cfg = job.config(rounds=100, runtime={"checkpoint_every": 10, "progress": True, "timeout_s": 3600,
                                          "lost_after_s": 5})
    reference = _reference(job, cfg)
    out = job.repo / "runs" / "f.h5"
    _wait_idle(job)  # a range takes what is free
    job_id = _submit_script(job, "flex", f'"$SLURM_SUBMIT_DIR/slurm/job.sh" {cfg} --out runs/f.h5 '
                                         f'--set runtime.device=cpu', "--nodes=1-2", round_s=0.2)
    wait_for_rows(out, 16, timeout=180)
    assert job.show(job_id)["NodeList"] == "n[1-2]"
    nodes("freeze", "n2")
    attrs = _wait_status(out, "failed", timeout=120)
    assert re.match(r"lost rank 1 \(node n2, pid \d+\): no heartbeat for \d+ s", attrs["lost"]), attrs
    kept = int(attrs["lost_checkpoint"])
    info = job.wait(job_id, timeout=300)
    log = job.log(job_id)
    assert info["JobState"] == "COMPLETED" and info["NodeList"] == "n1" and int(info["Restarts"]) >= 1, log
    assert "fedmpi: lost rank 1 (node n2" in log and f"resumed from round {kept}/100" in log, log
    assert int(_attrs(out)["world_size"]) == 1  # fedmpi-launch counts the tasks granted (SLURM_TASKS_PER_NODE)
    assert np.array_equal(_params(out), reference)


def _submit_script(job: Jobs, name: str, body: str, *opts: str, round_s: float = 0.0) -> str:
    """sbatch a script that runs ``body`` (what a template's last line does), log ``NAME-JOBID.out``."""
    script = job.repo / f"{name}.sh"
    script.write_text(f"#!/bin/bash\nexec {body}\n")
    p = subprocess.run(["sbatch", "--parsable", "--requeue", "--open-mode=append", "--cpus-per-task=1",
                        f"--output={name}-%j.out", *opts, str(script)], cwd=job.repo,
                       env=dict(job.env, FEDMPI_TEST_ROUND_S=str(round_s)), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip()


def test_a_node_local_output_folder_is_refused_at_the_start(job):
    """$TMPDIR is each node's own folder (the cluster's TaskProlog, as on many clusters): results
    there would be lost, and a resume on other nodes would not find the checkpoint."""
    cfg = job.config(rounds=4)
    job_id = _submit_script(job, "local", f'"$SLURM_SUBMIT_DIR/slurm/job.sh" {cfg} --out "$TMPDIR/r.h5" '
                                          f'--set runtime.device=cpu', "--nodes=2", "--ntasks-per-node=1")
    info = job.wait(job_id)
    log = job.log(job_id)
    assert info["JobState"] == "FAILED" and info["ExitCode"] == "2:0", log
    errors = [ln for ln in log.splitlines() if ln.startswith("fedmpi: error:")]
    assert len(errors) == 1 and "is not shared by the nodes of this run (n1, n2)" in errors[0], log
    assert "/tmp-n1/job-" in errors[0] and "node n1's own $TMPDIR" in errors[0], log
