"""Plug-ins: user algorithms, models, datasets and availability kinds with their own parameters,
loaded by --plugin, $FEDMPI_PLUGINS or an installed entry point, on every rank."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import h5py
import numpy as np
import pytest
import torch

from conftest import ROOT, fedmpi, mpiexec, synthetic_config, write_config
from fedmpi import config
from fedmpi.errors import InputError
from fedmpi.registry import ALGORITHMS

ALGO = '''
from dataclasses import dataclass

import numpy as np

from fedmpi.algorithms import ServerAlgorithm, register
from fedmpi.config import AlgorithmParams, opt


@dataclass
class ScaledParams(AlgorithmParams):
    scale: float = opt(0.5, "multiplies the mean update", gt=0, le=1)


@register("scaled_fedavg")
class ScaledFedAvg(ServerAlgorithm):
    """x^{t+1} = x^t + eta_g * scale * mean_{A_t} Delta_i"""

    Params = ScaledParams

    def weights(self, t, active, local):
        return np.full(len(local), self.params.scale / max(len(active), 1))
'''

COUNTED = '''
import numpy as np

from fedmpi.algorithms import ServerAlgorithm, register


@register("counted_fedavg")
class CountedFedAvg(ServerAlgorithm):
    """FedAvg with weights 1 / (1 + n_i), n_i = past participations of client i, kept per client."""

    client_state = ("seen",)  # checkpointed and re-sharded by fedmpi
    configuration = ("lo",)  # the shard's first id, fixed at set-up

    def __init__(self, ctx):
        super().__init__(ctx)
        lo, hi = ctx.shard
        self.lo, self.seen = lo, np.zeros(hi - lo, dtype=np.int64)

    def weights(self, t, active, local):
        return 1.0 / ((1 + self.seen[local - self.lo]) * max(len(active), 1))

    def after_round(self, t, active, local, start, end):
        self.seen[local - self.lo] += 1
'''

PARTS = '''
from dataclasses import dataclass

import numpy as np
from torch import nn

from fedmpi import participation
from fedmpi.config import AvailabilityParams, DatasetParams, ModelParams, opt
from fedmpi.data.datasets import DataArrays, register_dataset
from fedmpi.models import register as register_model


@dataclass
class TanhParams(ModelParams):
    width: int = opt(8, "hidden width", ge=1)


@register_model("tanh_net", params=TanhParams)
def tanh_net(in_shape, classes, params):
    return nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(in_shape)), params.width), nn.Tanh(),
                         nn.Linear(params.width, classes))


@dataclass
class BlobParams(DatasetParams):
    blob_samples: int = opt(300, "training samples", ge=10)


@register_dataset("blobs", params=BlobParams, cache=True)
def blobs(cfg):
    gen = np.random.default_rng(cfg.seed)
    n = cfg.task.blob_samples
    y = gen.integers(0, 3, n + 60)
    x = (gen.normal(size=(n + 60, 4)) + 2.0 * y[:, None]).astype(np.float32)
    return DataArrays(x[:n], y[:n], x[n:], y[n:], classes=3)


@dataclass
class EveryOtherParams(AvailabilityParams):
    offset: int = opt(0, "0: even ids in even rounds; 1: odd ids", ge=0, le=1)


class EveryOther(participation.Participation):
    def __init__(self, m, seed, offset):
        super().__init__(m, seed)
        self.offset = offset

    def available(self, t):
        return np.arange((t + self.offset) % 2, self.m, 2)


@participation.register("every_other", params=EveryOtherParams)
def every_other(params, info):
    return EveryOther(info.m, info.seed, params.offset)
'''


@pytest.fixture
def plugin(tmp_path):
    """Write a plug-in file; returns its path."""

    def write(name: str, text: str) -> str:
        path = tmp_path / f"{name}.py"
        path.write_text(textwrap.dedent(text))
        return str(path)

    return write


def quadratic(out, **algo) -> dict:
    return {"name": "q", "rounds": 6, "eval_every": 3, "output": str(out),
            "task": {"dataset": "quadratic", "model": "scalar", "clients": 4, "u": [0.0, 4.0, -2.0, 8.0]},
            "train": {"local_steps": 2, "lr": 0.3, "batch_size": 1},
            "algorithm": algo, "availability": {"kind": "always"}, "runtime": {"progress": False}}


def final(path) -> np.ndarray:
    with h5py.File(path, "r") as f:
        assert f.attrs["status"] == "completed"
        return f["final/params"][:]


def one_line_error(proc, needle: str) -> None:
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in proc.stderr, proc.stderr


def test_algorithm_with_its_own_parameter(tmp_path, plugin):
    """scale * mean update with eta_g = 1 is FedAvg with eta_g = scale, up to rounding."""
    from fedmpi.cli import main

    path = plugin("scaled", ALGO)
    mine = write_config(tmp_path / "a.yaml", quadratic(tmp_path / "a.h5", name="scaled_fedavg", scale=0.25))
    ref = write_config(tmp_path / "b.yaml", {**quadratic(tmp_path / "b.h5", name="fedavg_active", global_lr=0.25),
                                             "train": {"local_steps": 2, "lr": 0.3, "batch_size": 1}})
    assert main(["run", mine, "--quiet", "--plugin", path]) == 0
    assert main(["run", ref, "--quiet"]) == 0
    np.testing.assert_allclose(final(tmp_path / "a.h5"), final(tmp_path / "b.h5"), rtol=1e-6)
    with h5py.File(tmp_path / "a.h5") as f:  # the stored config holds the plug-in's parameter
        assert "scale: 0.25" in f.attrs["config"]
    cfg = config.load(mine)
    assert cfg.algorithm.scale == 0.25 and type(cfg.algorithm).__name__ == "ScaledParams"
    # its parameters extend AlgorithmParams only (written before ServerParams): a server's keys are added
    assert cfg.algorithm.global_lr == 1.0 and config.load(mine, ["algorithm.global_lr=0.5"]).algorithm.global_lr == 0.5


@pytest.mark.slow
def test_plugin_parameter_errors_name_the_key(tmp_path, plugin):
    path = plugin("scaled", ALGO)
    cfg = write_config(tmp_path / "a.yaml", quadratic(tmp_path / "a.h5", name="scaled_fedavg"))
    p = fedmpi(["run", cfg, "--plugin", path, "--set", "algorithm.scael=0.5"], check=False)
    one_line_error(p, "algorithm.scael: unknown key (allowed: name, global_lr, scale)")
    p = fedmpi(["run", cfg, "--plugin", path, "--set", "algorithm.scale=2"], check=False)
    one_line_error(p, "algorithm.scale: must be <= 1, got 2")
    p = fedmpi(["run", cfg], check=False)  # without the plug-in the name is unknown
    one_line_error(p, "algorithm.name: unknown algorithm 'scaled_fedavg' (registered: fedavg_active,")


@pytest.mark.slow
def test_keys_of_other_algorithms_are_ignored_with_a_notice(tmp_path):
    """A config written for fedswe keeps working with --set algorithm.name=mifa."""
    cfg = write_config(tmp_path / "a.yaml", quadratic(tmp_path / "a.h5", name="fedswe", k=3))
    p = fedmpi(["run", cfg, "--quiet", "--set", "algorithm.name=mifa"])
    assert "notice: algorithm.k: not a parameter of mifa (only of fedswe); ignored" in p.stderr
    with h5py.File(tmp_path / "a.h5") as f:
        assert "k:" not in f.attrs["config"].split("algorithm:")[1].split("availability:")[0]


@pytest.mark.slow
def test_plugin_sources(tmp_path, plugin):
    """The same plug-in by file, by folder, by module name, by $FEDMPI_PLUGINS and by entry point."""
    pkg = tmp_path / "site" / "myplug"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(ALGO)
    site = str(tmp_path / "site")
    dist = tmp_path / "site" / "myplug-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: myplug\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[fedmpi.plugins]\nscaled = myplug\n")
    cfg = write_config(tmp_path / "a.yaml", quadratic(tmp_path / "a.h5", name="scaled_fedavg", scale=0.5))
    ways = {
        "file": (["--plugin", plugin("scaled", ALGO)], {}),
        "folder": (["--plugin", str(pkg)], {}),
        "module": (["--plugin", "myplug"], {"PYTHONPATH": f"{ROOT}{os.pathsep}{site}"}),
        "env": ([], {"FEDMPI_PLUGINS": str(pkg)}),
        "entry point": ([], {"PYTHONPATH": f"{ROOT}{os.pathsep}{site}"}),
    }
    results = {}
    for way, (args, env) in ways.items():
        out = str(tmp_path / f"{way}.h5")
        fedmpi(["run", cfg, "--quiet", "--out", out, *args], env=env)
        results[way] = final(out)
    for way, got in results.items():
        assert np.array_equal(got, results["file"]), way


@pytest.mark.slow
def test_broken_plugins_are_one_line_errors(tmp_path, plugin):
    cfg = write_config(tmp_path / "a.yaml", quadratic(tmp_path / "a.h5", name="fedavg_active"))
    p = fedmpi(["run", cfg, "--plugin", str(tmp_path / "nothere.py")], check=False)
    one_line_error(p, "--plugin " + str(tmp_path / "nothere.py") + ": ")
    p = fedmpi(["run", cfg, "--plugin", "no_such_module_xyz"], check=False)
    one_line_error(p, "no_such_module_xyz: no such plug-in module")
    bad = plugin("bad", "import numpy\nraise RuntimeError('oops\\nsecond line')\n")
    p = fedmpi(["run", cfg, "--plugin", bad], check=False)
    one_line_error(p, "plug-in failed to load (RuntimeError: oops second line at " + bad + ":2)")
    clash = plugin("clash", ALGO.replace('register("scaled_fedavg")', 'register("fedswe")'))
    p = fedmpi(["run", cfg, "--plugin", clash], check=False)
    one_line_error(p, "algorithm 'fedswe' is already registered by fedmpi.algorithms.fedswe")
    p = fedmpi(["run", cfg], check=False, env={"FEDMPI_PLUGINS": bad})
    one_line_error(p, f"FEDMPI_PLUGINS: {bad}: plug-in failed to load")


def test_model_dataset_and_availability_plugins(tmp_path, plugin):
    """A plug-in model, dataset and availability kind, each with its own key in its block."""
    from fedmpi.build import build_task
    from fedmpi.plugins import load

    load([plugin("parts", PARTS)])
    data = {"seed": 1, "task": {"dataset": "blobs", "blob_samples": 200, "model": "tanh_net", "width": 5,
                                "clients": 6, "cache_dir": str(tmp_path / "cache")},
            "availability": {"kind": "every_other", "offset": 1}, "runtime": {"progress": False}}
    cfg = config.from_dict(data)
    assert (cfg.task.width, cfg.task.blob_samples, cfg.availability.offset) == (5, 200, 1)
    task = build_task(cfg, torch.device("cpu"))
    assert task.train_x.shape == (200, 4) and task.m == 6 and task.classes == 3
    assert task.model[1].weight.shape == (5, 4)  # width 5 from the task block
    assert len(os.listdir(tmp_path / "cache")) == 1  # cache=True: the arrays were stored
    again = build_task(cfg, torch.device("cpu"))  # from the cache: the same tensors
    assert np.array_equal(again.train_x.numpy(), task.train_x.numpy())
    for bad, needle in [({"task": {"width": 0}}, "task.width: must be >= 1"),
                        ({"task": {"blob_samples": 2}}, "task.blob_samples: must be >= 10"),
                        ({"availability": {"offset": 3}}, "availability.offset: must be <= 1"),
                        ({"availability": {"offst": 1}}, "availability.offst: unknown key (allowed: kind, offset)"),
                        ({"task": {"model": "tanh_nett"}}, "task.model: unknown model 'tanh_nett' (registered:")]:
        merged = {k: {**data[k], **bad.get(k, {})} if isinstance(data[k], dict) else data[k] for k in data}
        with pytest.raises(InputError, match="^" + needle.replace("(", r"\(").replace(")", r"\)")):
            config.from_dict(merged)


@pytest.mark.slow
@pytest.mark.mpi
def test_plugin_on_two_ranks_and_through_the_launcher(tmp_path, plugin):
    """--plugin reaches every rank (mpiexec and launch/fedmpi-launch); results equal 1 rank's."""
    path = plugin("scaled", ALGO)
    data = synthetic_config(rounds=4, task__clients=7)
    data["algorithm"] = {"name": "scaled_fedavg", "scale": 0.7}
    cfg = write_config(tmp_path / "c.yaml", data)
    one, two, three = (str(tmp_path / f"{n}.h5") for n in ("one", "two", "launch"))
    fedmpi(["run", cfg, "--out", one, "--quiet", "--plugin", path])
    fedmpi(["run", cfg, "--out", two, "--quiet", "--plugin", path], ranks=2)
    mpiexec(2)  # skips without mpiexec
    env = dict(os.environ, PYTHONPATH=ROOT, PYTHON=sys.executable)
    p = subprocess.run([os.path.join(ROOT, "launch", "fedmpi-launch"), "-n", "2", cfg, "--out", three, "--quiet",
                        "--plugin", path], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert p.returncode == 0, p.stderr
    for other in (two, three):
        assert np.array_equal(final(one), final(other))
        with h5py.File(other) as f:
            assert f.attrs["world_size"] == 2


@pytest.mark.slow
@pytest.mark.mpi
def test_plugin_client_state_is_checkpointed_and_resharded(tmp_path, plugin):
    """A plug-in declares per-client state only; a 1-rank run stopped by SIGUSR1 resumes on 2 ranks
    to the uninterrupted numbers."""
    import fault_plugin

    path = plugin("counted", COUNTED)
    data = synthetic_config(rounds=8, eval_every=2, task__clients=9)
    data["algorithm"] = {"name": "counted_fedavg"}
    cfg = write_config(tmp_path / "c.yaml", data)
    full, cut = str(tmp_path / "full.h5"), str(tmp_path / "cut.h5")
    fedmpi(["run", cfg, "--out", full, "--quiet", "--plugin", path])
    p = fedmpi(["run", cfg, "--out", cut, "--quiet", "--plugin", path], check=False, env=fault_plugin.env("0:3:usr1"))
    assert p.returncode == 3, p.stderr
    with h5py.File(cut) as f:
        assert f.attrs["status"] == "interrupted" and f.attrs["rounds_done"] == 4  # stopped after round 3
    fedmpi(["run", cfg, "--out", cut, "--quiet", "--plugin", path, "--resume"], ranks=2)
    assert np.array_equal(final(full), final(cut))
    with h5py.File(full) as a, h5py.File(cut) as b:
        assert np.array_equal(a["metrics/test_acc"][:], b["metrics/test_acc"][:])


def test_registry_refuses_what_it_cannot_use():
    with pytest.raises(TypeError, match="params must be a dataclass"):
        ALGORITHMS.register("x_bad", object(), params=dict)
    from fedmpi.algorithms import register

    with pytest.raises(TypeError, match="subclass of fedmpi.algorithms.Algorithm"):
        register("x_bad")(object)
