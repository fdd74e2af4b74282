"""One rule for paths in sweep files (relative to the sweep file), and messages that found
nothing say where they looked (docs/SWEEPS.md)."""

from __future__ import annotations

import glob
import os

import yaml

from conftest import ROOT, synthetic_config, write_config
from fedmpi.cli import main
from fedmpi.results import sweepfile


def _sweep(folder, **top) -> str:
    """A two-cell sweep file in ``folder`` (base config beside it)."""
    os.makedirs(folder, exist_ok=True)
    write_config(os.path.join(folder, "base.yaml"), synthetic_config(rounds=2, eval_every=2))
    path = os.path.join(folder, "s.sweep.yaml")
    with open(path, "w") as fh:
        yaml.safe_dump({"base": "base.yaml", "grid": {"seed": [0, 1]}, **top}, fh)
    return path


def test_out_and_its_default_are_relative_to_the_sweep_file(tmp_path):
    path = _sweep(tmp_path / "exp", out="results")
    assert sweepfile.load(path).folder == str(tmp_path / "exp" / "results")
    assert sweepfile.load(_sweep(tmp_path / "d")).folder == str(tmp_path / "d" / "runs" / "s")
    os.chdir(tmp_path / "exp")
    assert sweepfile.load("s.sweep.yaml").cells[0].path == os.path.join("results", "seed=0.h5")
    assert sweepfile.load("s.sweep.yaml", out="mine").folder == "mine"  # --out: the working directory's


def test_sweep_status_and_table_work_from_any_directory(tmp_path, capsys):
    _sweep(tmp_path / "exp", out="res")
    os.makedirs(tmp_path / "a" / "b")
    os.chdir(tmp_path / "a" / "b")
    assert main(["sweep", "../../exp/s.sweep.yaml", "--quiet"]) == 0
    assert sorted(glob.glob("*.h5", root_dir=tmp_path / "exp" / "res")) == ["seed=0.h5", "seed=1.h5"]
    assert not glob.glob(str(tmp_path / "a" / "**" / "*.h5"), recursive=True)
    os.chdir(tmp_path)
    capsys.readouterr()
    assert main(["sweep", "exp/s.sweep.yaml", "--status"]) == 0
    assert "2 cells: 2 done" in capsys.readouterr().out
    assert main(["table", str(tmp_path / "exp" / "s.sweep.yaml"), "--format", "csv"]) == 0
    assert "n" in capsys.readouterr().out.splitlines()[0]


def test_the_repositorys_sweeps_write_into_its_runs_folder():
    """configs/ says out: ../../runs/NAME, so `fedmpi sweep configs/...` writes runs/NAME from anywhere."""
    files = glob.glob(os.path.join(ROOT, "configs", "**", "*.sweep.yaml"), recursive=True)
    assert files
    for f in files:
        folder = sweepfile.load(f, validate=False).folder
        assert os.path.dirname(folder) == os.path.join(ROOT, "runs"), f


def test_found_nothing_says_where_it_looked(tmp_path, capsys):
    path = _sweep(tmp_path / "exp", out="res")
    where = str(tmp_path / "exp" / "res")
    assert main(["sweep", path, "--status"]) == 0
    assert "2 cells: 0 done" in (out := capsys.readouterr().out) and f"(result files in {where})" in out
    assert main(["table", path]) == 2
    err = capsys.readouterr().err
    assert "no completed runs to tabulate" in err and where in err and len(err.strip().splitlines()) == 1
    assert main(["plot", path, "--out", "f.png"]) == 2
    err = capsys.readouterr().err
    assert "no evaluations to plot" in err and where in err and len(err.strip().splitlines()) == 1
    os.makedirs("empty")
    assert main(["table", "empty"]) == 2 and "empty: no .h5 result files" in capsys.readouterr().err
