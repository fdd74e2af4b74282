"""The command line itself: one error prefix, quiet broken pipes, fast start-up, info/plot on many files."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import ROOT
from fake_results import fake_result
from fedmpi.cli import main

ROUNDS = [0, 5, 10]


def _py(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=dict(os.environ, PYTHONPATH=ROOT))


@pytest.mark.parametrize("args, line", [
    (["run"], "fedmpi: error: run: the following arguments are required: config"),
    (["table"], "fedmpi: error: table: the following arguments are required: inputs"),
    (["sweep", "x.yaml", "-j", "0"], "fedmpi: error: --jobs: must be >= 1, got 0"),
])
def test_one_error_prefix(capsys, args, line):
    assert main(args) == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]


def test_unknown_command_one_line(capsys):
    assert main(["bogus"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("fedmpi: error: argument command: invalid choice: 'bogus'")
    assert err[0].count("fedmpi") == 1


def test_broken_pipe_is_quiet(tmp_path):
    f = fake_result(tmp_path / "a.h5", {"round": ROUNDS, "test_acc": [0.1, 0.2, 0.3]})
    proc = subprocess.Popen([sys.executable, "-m", "fedmpi", "info", f], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=dict(os.environ, PYTHONPATH=ROOT))
    proc.stdout.close()  # the reader is gone before fedmpi writes (as `| head` after its lines)
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == ""


@pytest.mark.parametrize("argv", [["--help"], ["info", "FILE"], ["table", "FILE"], ["export", "FILE", "--out", "-"],
                                  ["sweep", "SWEEP", "--print-array-size"], ["sweep", "SWEEP", "--list"]])
def test_commands_on_result_files_do_not_import_torch(tmp_path, argv):
    f = fake_result(tmp_path / "a.h5", {"round": ROUNDS, "test_acc": [0.1, 0.2, 0.3]})
    sweep = tmp_path / "s.sweep.yaml"
    sweep.write_text(f"base: {ROOT}/configs/quickstart.yaml\nout: {tmp_path}\ngrid: {{seed: [0, 1]}}\n")
    argv = [{"FILE": f, "SWEEP": str(sweep)}.get(a, a) for a in argv]
    p = _py("import sys\nfrom fedmpi.cli import main\n"
            f"try:\n    code = main({argv!r})\nexcept SystemExit as e:\n    code = e.code\n"
            "print('torch' in sys.modules, 'matplotlib' in sys.modules, code)")
    assert p.stdout.strip().splitlines()[-1] == "False False 0", p.stderr


def test_info_compares_several_files(tmp_path, capsys):
    a = fake_result(tmp_path / "a.h5", {"round": ROUNDS, "test_acc": [0.1, 0.2, 0.3]}, algorithm__name="mifa")
    b = fake_result(tmp_path / "b.h5", {"round": ROUNDS, "test_acc": [0.1, 0.2, 0.4]}, status="running",
                    algorithm__name="fedvarp", train__lr=0.5)
    assert main(["info", a, b, "--verbose"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("differ from the first file: status completed vs running; config train.lr, algorithm.name; "
                        "metrics test_acc (max |difference| 0.1); final model (not in every file)")
    assert lines[1].split() == ["file", a, b] and lines[2].split() == ["status", "completed", "running"]
    start = lines.index("differing config keys:")
    differing = lines[start + 1:lines.index("last metrics:")]
    assert [ln.split()[0] for ln in differing] == ["train.lr", "algorithm.name"]
    assert differing[1].split() == ["algorithm.name", "mifa", "fedvarp"]
    assert any(ln.split() == ["test_acc", "0.3", "0.4"] for ln in lines)
    assert "same in all files:" in lines and "  task.dataset: synthetic" in lines
    assert main(["info", a, b, "--no-config", "--verbose"]) == 0
    assert "same in all files:" not in capsys.readouterr().out


def test_info_of_identical_runs_says_so_first_and_briefly(tmp_path, capsys):
    """#46 (4): `fedmpi info A B` printed ~110 lines (every last metric, every shared key) to say
    'identical'. The verdict comes first; the details are behind --verbose."""
    import h5py

    acc = {"round": ROUNDS, "test_acc": [0.1, 0.2, 0.3], "wall_time": [1.0, 2.0, 3.0]}
    a = fake_result(tmp_path / "a.h5", acc)
    b = fake_result(tmp_path / "b.h5", {**acc, "wall_time": [1.5, 2.5, 3.5]}, runtime__threads=2)
    with h5py.File(b, "r+") as f:
        f.attrs["world_size"] = 2
    assert main(["info", a, b]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("identical: the same experiment, metrics and final model, bit for bit (wall_time, peak_rss_mb "
                      "left out; they ran differently in runtime.threads, world size)")
    assert len(out) <= 12 and "same in all files:" not in out and out[-1].startswith("(--verbose:")
    assert main(["info", a, b, "--verbose"]) == 0
    verbose = capsys.readouterr().out.splitlines()
    assert verbose[0] == out[0] and "same in all files:" in verbose and len(verbose) > 40
    c = fake_result(tmp_path / "c.h5", {**acc, "test_acc": [0.1, 0.2, 0.3, 0.4], "round": ROUNDS + [30],
                                        "wall_time": [1.0] * 4}, rounds=30)
    with h5py.File(c, "r+") as f:
        f["final/params"][0] = 1.0
    assert main(["info", a, c]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == ("differ from the first file: metrics round (the same rows, 3 vs 4 evaluations), test_acc (the "
                      "same rows, 3 vs 4 evaluations); final model (max |difference| 1)"), out[0]
    rows = out[out.index("differing metrics (last values):") + 1:-1]
    assert [r.split() for r in rows] == [["round", "10", "30"], ["test_acc", "0.3", "0.4"]]


def test_plot_groups_by_result_keys_only(tmp_path):
    from fedmpi.results.plot import load_curves

    runs = [fake_result(tmp_path / "a.h5", {"round": ROUNDS, "test_acc": [0.1, 0.2, 0.3]}, seed=0),
            fake_result(tmp_path / "b.h5", {"round": ROUNDS, "test_acc": [0.1, 0.2, 0.5]}, seed=1,
                        runtime={"checkpoint_every": 7}, evaluation={"train": False}, rounds=10, eval_every=5),
            fake_result(tmp_path / "c.h5", {"round": ROUNDS, "test_acc": [0.1, 0.2, 0.9]}, seed=0,
                        algorithm__name="mifa", train__lr=0.5)]
    curves = load_curves(runs, "test_acc", "round")
    assert [(c[0], c[4]) for c in curves] == [("fedavg_active, lr=0.1", 2), ("mifa, lr=0.5", 1)]
    assert curves[0][2][-1] == pytest.approx(0.4) and curves[0][3][-1] == pytest.approx(0.1)


@pytest.mark.slow
@pytest.mark.mpi
def test_runs_from_the_parent_of_a_clone_named_fedmpi(tmp_path):
    """A clone is a folder named ``fedmpi``; from its parent, Python would import that folder as
    an empty namespace package unless the installed package is a path entry (setup.cfg's
    package_dir makes every editable mode one). ``python -m fedmpi`` and the launcher's ranks must both
    find the real package, as a user runs them: no PYTHONPATH."""
    from conftest import synthetic_config, write_config

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if subprocess.run([sys.executable, "-c", "import fedmpi.cli"], cwd="/", env=env).returncode != 0:
        pytest.skip("fedmpi is not installed (launch/install.sh installs it)")
    (tmp_path / "fedmpi" / "tests").mkdir(parents=True)  # the clone, seen from its parent
    p = subprocess.run([sys.executable, "-m", "fedmpi", "--version"], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("fedmpi "), p.stderr
    out = tmp_path / "r.h5"
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(output=str(out), rounds=2))
    p = subprocess.run([os.path.join(ROOT, "launch", "fedmpi-launch"), "-n", "2", cfg, "--quiet"],
                       capture_output=True, text=True, cwd=tmp_path, env=dict(env, PYTHON=sys.executable),
                       timeout=300)
    assert p.returncode == 0 and out.exists(), p.stderr


@pytest.mark.slow
@pytest.mark.parametrize("mode", [None, "strict"])
def test_every_editable_install_imports_the_package_from_the_parent_of_its_clone(tmp_path, mode):
    """#38: with a plain ``pip install -e .`` (setuptools' default editable mode, a finder that runs
    after the path search) the folder of a clone named fedmpi, seen from its parent, was imported
    as an empty namespace package. A fresh venv of this Python, fedmpi installed into it from a copy
    of the checkout in each mode (no dependencies: ``--version`` needs none), and no PYTHONPATH."""
    import shutil
    import sysconfig

    clone = tmp_path / "fedmpi"
    skip = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    shutil.copytree(os.path.join(ROOT, "fedmpi"), clone / "fedmpi", ignore=skip)
    for name in ("setup.cfg", "pyproject.toml", "README.md"):
        shutil.copy(os.path.join(ROOT, name), clone / name)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    # the build runs with this Python's setuptools (the venv's bundled one may be too old to build
    # editable wheels); a PYTHONPATH entry adds no .pth files, so the installed checkout stays out
    build_env = dict(env, PYTHONPATH=sysconfig.get_paths()["purelib"])
    cmd = [py, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index", "-e", str(clone)]
    p = subprocess.run(cmd + ([] if mode is None else ["--config-settings", f"editable_mode={mode}"]),
                       capture_output=True, text=True, env=build_env, timeout=600)
    assert p.returncode == 0, p.stderr
    p = subprocess.run([py, "-c", "import fedmpi.cli; print(fedmpi.__file__)"], capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=120)
    assert p.returncode == 0 and p.stdout.strip().startswith(str(clone)), p.stdout + p.stderr
    p = subprocess.run([py, "-m", "fedmpi", "--version"], capture_output=True, text=True, cwd=tmp_path, env=env,
                       timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("fedmpi "), p.stderr


def test_info_digest_of_final_params(tmp_path, capsys):
    """``fedmpi info`` prints a digest of /final/params; with several files it says whether the
    final models are identical or how far apart."""
    import h5py

    a, b, c = (fake_result(tmp_path / f"{n}.h5", {"round": ROUNDS, "test_acc": [0.1, 0.2, 0.3]}) for n in "abc")
    with h5py.File(c, "r+") as f:
        f["final/params"][1] = 0.25
    running = fake_result(tmp_path / "r.h5", {"round": ROUNDS, "test_acc": [0.1, 0.2, 0.3]}, status="running")
    assert main(["info", a, "--no-config"]) == 0
    line = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("final params:")]
    assert line and "sha256:" in line[0] and "(3 values)" in line[0]
    assert main(["info", a, b, c, running, "--no-config"]) == 0
    out = capsys.readouterr().out.splitlines()
    row = next(ln for ln in out if ln.startswith("final params"))
    digests = re.findall(r"sha256:\w+", row)
    assert len(digests) == 3 and digests[0] == digests[1] != digests[2] and row.rstrip().endswith(" -")
    vs = next(ln for ln in out if ln.startswith("vs first file"))
    assert "identical" in vs and "max |difference| 0.25" in vs
