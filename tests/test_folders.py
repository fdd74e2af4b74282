"""The output folder of ranks on several nodes must be one they all see (fedmpi/runtime/folders.py):
two "nodes" on this machine, rank 1 in a mount and host-name namespace of its own (``unshare``,
root), where an empty file system hides the output folder, as a node-local folder is hidden from
other nodes. On the real two-node Slurm: tests/test_slurm_nodes.py (a per-node ``$TMPDIR``)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys

import pytest

from conftest import ROOT, mpiexec, synthetic_config, write_config


def _unshare_works() -> bool:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "-u", "true"], capture_output=True).returncode == 0


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("hidden", [True, False])
def test_an_output_folder_that_another_node_does_not_see_is_refused(tmp_path, hidden):
    if not _unshare_works():
        pytest.skip("needs root and unshare (mount and UTS namespaces)")
    out = tmp_path / "out"
    out.mkdir()
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=2))
    run = [sys.executable, "-m", "fedmpi", "run", cfg, "--out", str(out / "r.h5"), "--quiet"]
    hide = f"mount -t tmpfs none {out} && " if hidden else ""
    other_node = ["unshare", "-m", "-u", "sh", "-c", f'hostname node-b && {hide}exec "$0" "$@"', *run]
    cmd = mpiexec(2)
    n = cmd.index("-n")
    cmd = cmd[:n] + ["-n", "1", "-x", "PYTHONPATH", *run, ":", "-n", "1", "-x", "PYTHONPATH", *other_node]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    if not hidden:
        assert p.returncode == 0, p.stderr
        assert f"2 ranks on 2 nodes: {socket.gethostname()} (rank 0), node-b (rank 1)" in p.stderr
        return
    assert p.returncode == 2, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("fedmpi: error:")]
    assert errors == [f"fedmpi: error: --out: {out} is not shared by the nodes of this run "
                      f"({', '.join(sorted([socket.gethostname(), 'node-b']))}): rank 1 on node node-b does not see "
                      f"what rank 0 on node {socket.gethostname()} wrote there (a folder local to each node); put the "
                      f"result file on a file system that every node mounts"], p.stderr
    assert "Traceback" not in p.stderr
    assert not [f for f in os.listdir(out) if f.startswith(".fedmpi-probe")]  # rank 0 removed its probe
