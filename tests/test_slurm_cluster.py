"""fedmpi on one node of the tests' real Slurm (tests/slurm/cluster.sh): the templates from a fresh
checkout, preemption and requeue, time limits, scancel, job arrays and exit codes (across its two
nodes: tests/test_slurm_nodes.py).

Marked ``slurm``: they run when a cluster is up (``tests/slurm/cluster.sh up``, as root) or
may be started (``FEDMPI_SLURM=1``, as .ci/run's Slurm step sets), and are skipped otherwise.
Each test submits from its own copy of the checkout's files (no ``runs/``, like a fresh clone).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time

import h5py
import numpy as np
import pytest

from conftest import ROOT, synthetic_config, wait_for_rows, write_config

pytestmark = pytest.mark.slurm
CLUSTER = os.path.join(ROOT, "tests", "slurm", "cluster.sh")
CONF = os.path.join(os.environ.get("FEDMPI_SLURM_DIR", "/tmp/fedmpi-slurm"), "etc", "slurm.conf")
SLOW = os.path.join(ROOT, "tests", "slurm", "slow_rounds.py")
TEARDOWN_KILL = os.path.join(ROOT, "tests", "slurm", "teardown_kill.py")
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")  # a job's end states


def _up() -> bool:
    env = dict(os.environ, SLURM_CONF=CONF)
    return (os.path.exists(CONF) and shutil.which("scontrol") is not None
            and subprocess.run(["scontrol", "ping"], env=env, capture_output=True, timeout=20).returncode == 0)


@pytest.fixture(scope="session")
def cluster() -> str:
    """The Slurm configuration file of a running cluster (started here when FEDMPI_SLURM=1)."""
    if not _up():
        if os.environ.get("FEDMPI_SLURM") != "1":
            pytest.skip("no Slurm cluster up: run tests/slurm/cluster.sh up (root) or set FEDMPI_SLURM=1")
        if os.geteuid() != 0:
            pytest.skip("starting a Slurm cluster needs root")
        subprocess.run(["bash", CLUSTER, "up"], check=True, timeout=600)
    return CONF


@pytest.fixture
def job(cluster, tmp_path):
    """A fresh copy of the checkout (tracked and unignored files: no runs/) and a way to submit in it."""
    repo = tmp_path / "fedmpi"
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for f in filter(None, files):
        if os.path.isfile(os.path.join(ROOT, f)):
            os.makedirs(repo / os.path.dirname(f), exist_ok=True)
            shutil.copy2(os.path.join(ROOT, f), repo / f)
    assert not (repo / "runs").exists()
    return Jobs(repo, cluster)


class Jobs:
    def __init__(self, repo, conf: str):
        self.repo = repo
        python_dir = os.path.dirname(sys.executable)
        self.env = dict(os.environ, SLURM_CONF=conf, PYTHONPATH=str(repo), PYTHON=sys.executable,
                        PATH=f"{python_dir}{os.pathsep}{os.environ['PATH']}", FEDMPI_PLUGINS=SLOW)
        for var in [v for v in self.env if v.startswith("SLURM_") and v != "SLURM_CONF"]:
            del self.env[var]

    def config(self, name: str = "c", **over) -> str:
        over = {"rounds": 40, "eval_every": 2, "runtime": {"checkpoint_every": 2, "progress": True}, **over}
        return write_config(self.repo / f"{name}.yaml", synthetic_config(**over))

    def sbatch(self, template: str, *args: str, opts: tuple = (), round_s: float = 0.0, ranks: int = 2) -> str:
        cmd = ["sbatch", "--parsable", f"--ntasks={ranks}", "--cpus-per-task=1", *opts, f"slurm/{template}", *args]
        p = subprocess.run(cmd, cwd=self.repo, env=dict(self.env, FEDMPI_TEST_ROUND_S=str(round_s)),
                           capture_output=True, text=True, timeout=60)
        assert p.returncode == 0, p.stderr
        return p.stdout.strip().split(";")[0]

    def run(self, *cmd: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run(list(cmd), cwd=self.repo, env=self.env, capture_output=True, text=True, timeout=timeout)

    def show(self, job_id: str) -> dict[str, str]:
        out = self.run("scontrol", "show", "job", "-o", job_id).stdout
        return dict(kv.split("=", 1) for kv in out.split() if "=" in kv)

    def wait(self, job_id: str, states=FINAL, timeout: float = 300) -> dict[str, str]:
        deadline = time.time() + timeout
        while time.time() < deadline:
            info = self.show(job_id)
            if info.get("JobState") in states:
                return info
            time.sleep(0.5)
        raise AssertionError(f"job {job_id} not in {states} after {timeout} s: {self.show(job_id)}\n{self.log(job_id)}")

    def log(self, job_id: str) -> str:
        logs = list(self.repo.glob(f"*-{job_id}.out")) + list(self.repo.glob(f"*_{job_id}.out"))
        return logs[0].read_text() if logs else "(no .out file)"

    def restarts(self, job_id: str) -> int:
        return int(self.show(job_id).get("Restarts", 0))


def _params(path) -> np.ndarray:
    with h5py.File(path, "r") as f:
        assert f.attrs["status"] == "completed"
        return f["final/params"][:]


def _reference(jobs: Jobs, cfg: str) -> np.ndarray:
    """The uninterrupted run (one process: same seed, same results on any rank count)."""
    out = jobs.repo / "reference.h5"
    p = jobs.run(sys.executable, "-m", "fedmpi", "run", cfg, "--out", str(out), "--quiet")
    assert p.returncode == 0, p.stderr
    return _params(out)


# ----------------------------------------------------------------------------- the templates

@pytest.mark.parametrize("template, opts", [
    ("cpu_ranks.sbatch", ()),
    ("single_node_gpus.sbatch", ("--gpus-per-node=0", "--ntasks-per-node=2")),
    ("multi_node.sbatch", ("--nodes=1", "--gpus-per-node=0", "--ntasks-per-node=2")),
])
def test_template_runs_from_a_fresh_clone(job, template, opts):
    """The job died before its script (no runs/ for --output); now its log is in the submit folder."""
    cfg = job.config(rounds=6)
    job_id = job.sbatch(template, cfg, "--out", "runs/r.h5", "--set", "runtime.device=cpu", opts=opts)
    info = job.wait(job_id)
    log = job.log(job_id)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log
    assert re.search(r"fedmpi: round 6/6 ", log) and "fedmpi: wrote runs/r.h5" in log, log
    with h5py.File(job.repo / "runs" / "r.h5", "r") as f:
        assert f.attrs["status"] == "completed" and int(f.attrs["world_size"]) == 2


def test_sweep_array_with_one_task_preempted_completes_and_tabulates(job):
    base = job.config(rounds=20)
    sweep = job.repo / "s.sweep.yaml"
    sweep.write_text(f"base: {base}\ngrid:\n  seed: [1, 2]\nout: runs/s\n")
    n = job.run(sys.executable, "-m", "fedmpi", "sweep", str(sweep), "--print-array-size")
    assert n.returncode == 0 and n.stdout.strip() == "2", n.stderr
    array = job.sbatch("sweep_array.sbatch", str(sweep), opts=("--array=0-1",), round_s=0.3, ranks=1)
    cell = job.repo / "runs" / "s" / "seed=2.h5"
    wait_for_rows(cell, 3)
    assert job.run("scancel", "--signal=USR1", "--batch", f"{array}_1").returncode == 0
    for task in ("0", "1"):
        info = job.wait(f"{array}_{task}")
        assert info["JobState"] == "COMPLETED", job.log(f"{array}_{task}")
    assert "requeueing job" in job.log(f"{array}_1")
    status = job.run(sys.executable, "-m", "fedmpi", "sweep", str(sweep), "--status")
    assert status.returncode == 0 and status.stdout.count(" done") >= 2, status.stdout + status.stderr
    table = job.run(sys.executable, "-m", "fedmpi", "table", str(sweep))
    assert table.returncode == 0 and "test_acc" in table.stdout and " +/- " in table.stdout, table.stderr


# ----------------------------------------------------------------------------- preemption and requeue

def test_preemptions_requeue_and_resume_to_identical_results(job):
    """scancel --signal=USR1 --batch, scancel -s USR1 and scontrol requeue, one after another on one
    job submitted with --overwrite (which once restarted every requeue from round 0)."""
    cfg = job.config(rounds=60)
    reference = _reference(job, cfg)
    out = job.repo / "runs" / "p.h5"
    job_id = job.sbatch("cpu_ranks.sbatch", cfg, "--out", "runs/p.h5", "--overwrite", round_s=0.25)
    rows = 3
    for restart, how in enumerate((["scancel", "--signal=USR1", "--batch"], ["scancel", "-s", "USR1"],
                                   ["scontrol", "requeue"]), start=1):
        wait_for_rows(out, rows, timeout=180)
        while job.show(job_id).get("JobState") != "RUNNING":
            time.sleep(0.2)
        assert job.run(*how, job_id).returncode == 0
        deadline = time.time() + 120
        while job.restarts(job_id) < restart and time.time() < deadline:
            time.sleep(0.3)
        assert job.restarts(job_id) == restart, job.log(job_id)
        with h5py.File(out, "r", locking=False) as f:
            rows = f["metrics/round"].shape[0] + 2
    info = job.wait(job_id)
    log = job.log(job_id)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log
    assert log.count("fedmpi: interrupted: signal") >= 2 and "--overwrite ignored: this is restart" in log, log
    assert np.array_equal(_params(out), reference)


def test_time_limit_requeues_and_completes(job):
    """--signal=B:USR1@N before --time: checkpoint, requeue, and the last start completes (a USR1
    that comes during its teardown once turned COMPLETED into FAILED 138). Slurm checks time limits
    on a timer (every 30 s here) and sends the warning early rather than late (sbatch(1): "up to 60
    seconds earlier"): each start of this 1-minute job gets USR1 at the first check, anywhere in
    its first 30 s (seen: 8 s), so 32 s of rounds always need a requeue, and how many depends on
    the machine's load (a start may run no round at all). So the job is waited on for as long as
    it makes progress, not for a fixed time (420 s was not always enough)."""
    cfg = job.config(rounds=80)
    reference = _reference(job, cfg)
    out = job.repo / "runs" / "t.h5"
    job_id = job.sbatch("cpu_ranks.sbatch", cfg, "--out", "runs/t.h5", opts=("--time=1", "--signal=B:USR1@40"),
                        round_s=0.4)
    info = _wait_progressing(job, job_id, out)
    log = job.log(job_id)
    assert info["JobState"] == "COMPLETED" and int(info["Restarts"]) >= 1, log
    assert "requeueing job" in log
    assert np.array_equal(_params(out), reference)


def _rows(path) -> int:
    try:
        with h5py.File(path, "r", locking=False) as f:
            return f["metrics/round"].shape[0]
    except (OSError, KeyError):
        return 0


def _wait_progressing(job: Jobs, job_id: str, out, stall: float = 240) -> dict[str, str]:
    """Until the job ends, however often it is requeued, as long as its result file ``out`` gains an
    evaluation every ``stall`` seconds (a job that is requeued without progress fails here)."""
    best, heard = -1, time.time()
    while True:
        info = job.show(job_id)
        if info.get("JobState") in FINAL:
            return info
        rows = _rows(out)
        if rows > best:
            best, heard = rows, time.time()
        elif time.time() - heard > stall:
            raise AssertionError(f"job {job_id}: no new evaluation in {out} for {stall} s ({best} rows, "
                                 f"{info.get('Restarts')} restarts): {info}\n{job.log(job_id)}")
        time.sleep(0.5)


def test_plain_scancel_stops_for_good_and_resubmitting_resumes(job):
    cfg = job.config(rounds=60)
    out = job.repo / "runs" / "c.h5"
    job_id = job.sbatch("cpu_ranks.sbatch", cfg, "--out", "runs/c.h5", round_s=0.25)
    wait_for_rows(out, 4, timeout=180)
    assert job.run("scancel", job_id).returncode == 0
    info = job.wait(job_id)
    time.sleep(3)  # a requeue would show by now
    info = job.show(job_id)
    assert info["JobState"] == "CANCELLED" and info["Restarts"] == "0", job.log(job_id)
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "interrupted"
        done = int(f.attrs["rounds_done"])
    assert done > 0 and os.path.exists(f"{out}.ckpt/manifest.json")
    again = job.sbatch("cpu_ranks.sbatch", cfg, "--out", "runs/c.h5")
    assert job.wait(again)["JobState"] == "COMPLETED", job.log(again)
    assert f"resumed from round {done}/60" in job.log(again)
    first = int(re.search(r"fedmpi: round (\d+)/60", job.log(again))[1])  # its first evaluation
    assert done < first <= done + 2, job.log(again)
    assert np.array_equal(_params(out), _reference(job, cfg))


def test_signal_in_the_first_second_of_a_job(job):
    """USR1 at once: a clean exit 3, requeued, completed; a plain scancel at once: CANCELLED, and
    the result file is never left 'running'."""
    cfg = job.config(rounds=6)
    for how, state in ((["scancel", "--signal=USR1", "--batch"], "COMPLETED"), (["scancel"], "CANCELLED")):
        out = f"runs/{state}.h5"
        job_id = job.sbatch("cpu_ranks.sbatch", cfg, "--out", out)
        while job.show(job_id).get("JobState") != "RUNNING":
            time.sleep(0.1)
        time.sleep(0.5)
        assert job.run(*how, job_id).returncode == 0
        info = job.wait(job_id, states=(state,) if state == "COMPLETED" else
                        ("CANCELLED", "COMPLETED", "FAILED"))
        assert info["JobState"] == state, job.log(job_id)
        if os.path.exists(job.repo / out):
            with h5py.File(job.repo / out, "r") as f:
                assert f.attrs["status"] in ("interrupted", "completed")


# ----------------------------------------------------------------------------- exit codes

def test_a_rank_killed_after_rank_0_completed_the_run_leaves_the_job_completed(job):
    """Rank 1 dies by SIGKILL in its teardown, after rank 0 completed the run and recorded exit 0
    (as when Slurm delivered a kill it had kept for a node that was down to the requeued job's
    step of the same id, once the node was back): the results stand, and the job is COMPLETED,
    not FAILED 137 as srun reports."""
    cfg = job.config(rounds=4)
    job.env.update(FEDMPI_PLUGINS=f"{SLOW}{os.pathsep}{TEARDOWN_KILL}", FEDMPI_TEST_TEARDOWN_KILL="1")
    job_id = job.sbatch("cpu_ranks.sbatch", cfg, "--out", "runs/d.h5")
    info = job.wait(job_id)
    log = job.log(job_id)
    assert info["JobState"] == "COMPLETED" and info["ExitCode"] == "0:0", log
    assert re.search(r"exited \d+ after rank 0 had completed the run", log), log  # the kill did come
    assert np.array_equal(_params(job.repo / "runs" / "d.h5"), _reference(job, cfg))


def test_exit_codes_through_srun_and_fedmpi_launch(job):
    """0 done, 1 failure, 2 bad input (which --kill-on-bad-exit once turned into 143), 3 interrupted,
    4 diverged: what fedmpi-launch returns under salloc, i.e. through srun. And srun without PMIx
    (MpiDefault=none's behaviour) is refused with exit 2 instead of N one-rank runs."""
    cases = {0: job.config("ok", rounds=4), 2: job.config("bad", rounds=4, **{"train.lr": -1.0}),
             4: job.config("nan", rounds=4, **{"train.lr": 1.0e300})}
    script = [f"launch/fedmpi-launch {cases[0]} --out runs/0.h5 --quiet; echo code0=$?",
              f"launch/fedmpi-launch {cases[2]} --out runs/2.h5 --quiet; echo code2=$?",
              f"launch/fedmpi-launch {cases[4]} --out runs/4.h5 --quiet; echo code4=$?",
              f"FEDMPI_TEST_FAULT=1:2:raise FEDMPI_PLUGINS=tests/fault_plugin.py "
              f"launch/fedmpi-launch {cases[0]} --out runs/1.h5 --quiet; echo code1=$?",
              f"FEDMPI_TEST_FAULT=0:2:usr1 FEDMPI_PLUGINS=tests/fault_plugin.py "
              f"launch/fedmpi-launch {cases[0]} --out runs/3.h5 --quiet; echo code3=$?",
              f"FEDMPI_SRUN_MPI=none launch/fedmpi-launch {cases[0]} --out runs/n.h5 --quiet; echo codeN=$?"]
    p = job.run("salloc", "-n", "2", "bash", "-c", "; ".join(script), timeout=600)
    codes = dict(re.findall(r"code(\w)=(\d+)", p.stdout))
    assert codes == {"0": "0", "1": "1", "2": "2", "3": "3", "4": "4", "N": "2"}, p.stdout + p.stderr
    assert "but MPI started a world of 1" in p.stderr
