"""Privacy, second step (issue #34): what a DP researcher reports (the noise multiplier in the
result file and ``fedmpi info``), amplified banded MF, accounting of fixed-size cohorts, centred
adaptive clipping and production-cohort noise (docs/PRIVACY.md)."""

from __future__ import annotations

import h5py
import pytest
from conftest import synthetic_config

from fedmpi import config
from fedmpi.cli import main
from fedmpi.runner import Runner
from fedmpi.runtime import World

dp = pytest.importorskip("dp_accounting")

SPARSE = {"kind": "stationary", "base": {"kind": "fixed", "values": [0.5]}}


def run(cfg: dict, path) -> str:
    Runner(config.from_dict(cfg), World(), str(path), quiet=True).run()
    return str(path)


# ----------------------------------------------------------------------------- what users report

def test_info_shows_the_calibrated_noise_multiplier(tmp_path, capsys):
    cfg = synthetic_config(rounds=4, algorithm={"name": "fedavg_active"}, availability=SPARSE,
                           privacy={"mechanism": "gaussian", "clip": 1.0, "epsilon": 8.0})
    out = run(cfg, tmp_path / "r.h5")
    with h5py.File(out) as f:
        sigma = f["privacy/noise_multiplier"][:]
    assert sigma.shape == (4,) and sigma[0] > 0
    assert main(["info", out, "--no-config"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("privacy:"))
    assert f"noise multiplier {sigma[0]:.6g} (calibrated to epsilon 8 over 4 rounds)" in line, line
    assert "gaussian" in line and "delta 1e-06" in line and "accountant rdp" in line


def test_info_shows_a_given_noise_multiplier_beside_other_runs(tmp_path, capsys):
    cfg = synthetic_config(rounds=2, algorithm={"name": "fedavg_active"}, availability=SPARSE)
    plain = run(cfg, tmp_path / "plain.h5")
    cfg["privacy"] = {"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 0.75}
    private = run(cfg, tmp_path / "dp.h5")
    assert main(["info", private, "--no-config"]) == 0
    assert "noise multiplier 0.75 (given)" in capsys.readouterr().out
    assert main(["info", plain, private, "--no-config"]) == 0
    row = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("noise multiplier"))
    assert row.split()[2:] == ["-", "0.75"]
