"""The reviewers' baselines (fedavgm, fedadam, fedyogi, fedadagrad, scaffold, fedprox) through the runner:
under every availability kind (the Markov sampler included), checkpoint/resume identical to an
uninterrupted run, and their parameters validated like every other key."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from conftest import assert_resume_identical, fedmpi, synthetic_config, write_config
from helpers.quadratic import quadratic_cfg

from fedmpi import config
from fedmpi.errors import InputError
from fedmpi.registry import AVAILABILITY
from fedmpi.runner import Runner
from fedmpi.runtime import World

NEW = ["fedavgm", "fedadam", "fedyogi", "fedadagrad", "scaffold", "fedprox"]
OWN = {"fedadam": {"algorithm.global_lr": 0.03}, "fedyogi": {"algorithm.global_lr": 0.03},
       "fedadagrad": {"algorithm.global_lr": 0.03}}  # the adaptive steps are ~eta_g per coordinate

KINDS = {  # one small setting per built-in availability kind
    "always": {}, "cohort": {"size": 4}, "stationary": {}, "staircase": {"period": 4}, "sine": {"period": 4},
    "interleaved_sine": {"period": 4}, "periodic_groups": {"period": 4}, "cyclic": {"groups": 3},
    "markov": {"B": 2, "R": 2}, "trace": {"schedule": [[0, 1, 2], [], [3, 4, 5, 6], [7]]},
}


def test_every_builtin_kind_is_covered():
    assert sorted(KINDS) == sorted(AVAILABILITY.names(builtin_only=True))


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("name", NEW)
def test_runs_under_every_availability_kind(name, kind, tmp_path):
    cfg = synthetic_config(rounds=4, eval_every=4, **{"algorithm.name": name, **OWN.get(name, {})})
    cfg["task"]["partition"] = {"kind": "groups", "groups": 2, "alpha": 0.5}  # periodic_groups needs groups
    cfg["availability"] = {"kind": kind, **KINDS[kind]}
    Runner(config.from_dict(cfg), World(), str(tmp_path / "r.h5"), quiet=True).run()
    with h5py.File(tmp_path / "r.h5") as f:
        assert f.attrs["status"] == "completed"
        assert np.isfinite(f["final/params"][:]).all()
        assert np.isfinite(f["metrics/test_loss"][:]).all()
        trained = f["metrics/n_active"][:]
        assert trained.sum() > 0 or kind == "trace"


@pytest.mark.slow
@pytest.mark.parametrize("name", NEW)
def test_checkpoint_resume_gives_the_same_run(name, tmp_path):
    """Fail at round 5, resume from the round-4 checkpoint, finish as if uninterrupted."""
    cfg = quadratic_cfg(name, [[0.0, 1.0], [8.0, -2.0], [-4.0, 3.0], [1.0, 1.0], [2.0, -6.0]],
                        availability={"kind": "stationary", "base": {"kind": "fixed", "values": [0.4]}},
                        eta_g=0.1 if name in OWN else 1.0)
    cfg.rounds, cfg.eval_every, cfg.runtime.checkpoint_every = 8, 2, 2
    assert_resume_identical(cfg, tmp_path)


@pytest.mark.parametrize("key, value", [("beta1", 1.0), ("beta2", -0.1), ("tau", 0.0)])
def test_adaptive_parameters_are_range_checked(key, value):
    with pytest.raises(InputError, match=rf"^algorithm\.{key}: must be"):
        config.from_dict({"algorithm": {"name": "fedadam", key: value}})


@pytest.mark.slow
def test_a_typo_in_a_parameter_is_exit_2_naming_the_key(tmp_path):
    """From the CLI a misspelt key is exit 2 naming it; fedadagrad has no beta2 (its v is a running sum)."""
    path = write_config(tmp_path / "c.yaml", synthetic_config(**{"algorithm.name": "fedavgm",
                                                                   "algorithm.server_momentun": 0.5}))
    proc = fedmpi(["run", path, "--out", str(tmp_path / "r.h5")], check=False)
    assert proc.returncode == 2 and "algorithm.server_momentun" in proc.stderr
    assert "algorithm.beta2" not in repr(config.from_dict({"algorithm": {"name": "fedadagrad"}}).algorithm)
