"""The SLURM templates' preemption logic, run by bash with stand-ins for srun and scontrol
(tests/test_slurm_cluster.py runs them on a real Slurm)."""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys

import h5py
import pytest

from conftest import wait_for_rows, ROOT, synthetic_config, write_config


def _shim(folder, name: str, body: str) -> None:
    path = folder / name
    path.write_text("#!/usr/bin/env bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


@pytest.mark.slow
@pytest.mark.parametrize("template, srun_code, sig", [("single_node_gpus.sbatch", "", signal.SIGUSR1),
                                                      ("cpu_ranks.sbatch", "", signal.SIGUSR1),
                                                      ("multi_node.sbatch", "137", signal.SIGUSR1),
                                                      ("cpu_ranks.sbatch", "", signal.SIGTERM)])
def test_usr1_requeues_and_term_stops(tmp_path, template, srun_code, sig):
    """srun_code: what srun reports when a task failed; 137 is srun's answer when --kill-on-bad-exit
    killed a task that had not exited yet: the template must still see rank 0's 3 and requeue.
    USR1 (a preemption warning) requeues; TERM alone (a user's scancel) checkpoints and stops."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    # srun stand-in: drop srun's own options, run the command (one task), forward signals to it
    _shim(bin_dir, "srun", 'while [[ "$1" == --* ]]; do shift; done\n"$@" &\nchild=$!\n'
                           'trap \'kill -USR1 $child\' USR1\ntrap \'kill -TERM $child\' TERM\n'
                           'while true; do code=0; wait $child || code=$?; '
                           'kill -0 $child 2>/dev/null || break; done\n'
                           f'[[ $code -ne 0 && -n "{srun_code}" ]] && code={srun_code or 0}\nexit $code\n')
    _shim(bin_dir, "scontrol", f'echo "$@" >> {tmp_path}/scontrol.log\n')
    out = tmp_path / "r.h5"
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(output=str(out), rounds=100000, eval_every=2,
                                                              runtime={"progress": False}))
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.path.dirname(sys.executable)}{os.pathsep}"
               f"{os.environ['PATH']}", SLURM_JOB_ID="4242", SLURM_SUBMIT_DIR=ROOT, PYTHONPATH=ROOT)
    proc = subprocess.Popen(["bash", os.path.join(ROOT, "slurm", template), cfg, "--quiet"], cwd=tmp_path,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for_rows(out, 2)
    proc.send_signal(sig)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 3, stderr
    requeued = os.path.exists(tmp_path / "scontrol.log") and "requeue 4242" in (tmp_path / "scontrol.log").read_text()
    assert requeued == (sig == signal.SIGUSR1), stdout
    assert ("requeueing job 4242" if requeued else "stopped by scancel") in stdout
    assert os.path.exists(str(out) + ".ckpt/manifest.json")
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "interrupted"
    assert not os.path.exists(tmp_path / "runs" / ".fedmpi-exit-4242")  # the launcher removes it


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("case, code", [("interrupted", 3), ("bad input", 2)])
def test_an_agreed_ending_prints_no_open_mpi_banner(tmp_path, case, code):
    """Issue 35: a clean interruption (exit 3) made Open MPI print its failure banner ("prterun
    detected that one or more processes exited with non-zero status"). Under fedmpi-launch the
    ranks exit 0 after an ending they all agreed on and the launcher returns rank 0's code."""
    if shutil.which("mpiexec") is None:
        pytest.skip("mpiexec not found")
    over = {"train.lr": -1.0} if code == 2 else {}
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=20, runtime={"progress": False}, **over))
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHON=sys.executable, FEDMPI_LAUNCHER="mpiexec",
               FEDMPI_PLUGINS=os.path.join(ROOT, "tests", "fault_plugin.py"), FEDMPI_TEST_FAULT="0:2:usr1")
    p = subprocess.run(["bash", os.path.join(ROOT, "launch", "fedmpi-launch"), "-n", "2", cfg, "--out",
                        str(tmp_path / "r.h5"), "--quiet"], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == code, p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("fedmpi: " + ("interrupted:" if code == 3 else "error:")), p.stderr
