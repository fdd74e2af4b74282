"""Plug-ins on every command that reads configs or results (--plugin, $FEDMPI_PLUGINS), a hint
when a name is unknown, and a sweep file's own ``plugins:``."""

from __future__ import annotations

import glob
import os

import pytest
import yaml

from conftest import fedmpi, synthetic_config, write_config
from fedmpi import config
from fedmpi.cli import build_parser, main
from fedmpi.errors import InputError
from test_plugins import ALGO, quadratic

LOUD = "raise RuntimeError('plug-in was loaded')\n"


def test_every_command_takes_plugin():
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    assert len(sub.choices) >= 9
    for name, parser in sub.choices.items():
        assert any("--plugin" in a.option_strings for a in parser._actions), name


@pytest.mark.parametrize("args", [["table", "r.h5"], ["export", "r.h5"], ["plot", "r.h5", "--out", "f.png"],
                                  ["info", "r.h5"], ["availability", "c.yaml"]])
@pytest.mark.parametrize("how", ["option", "env"])
def test_reading_commands_load_the_plugins(tmp_path, monkeypatch, capsys, args, how):
    """The plug-in is imported before the command reads anything (this one fails to load, which shows it)."""
    (tmp_path / "loud.py").write_text(LOUD)
    if how == "env":
        monkeypatch.setenv("FEDMPI_PLUGINS", str(tmp_path / "loud.py"))
    else:
        args = [*args, "--plugin", "loud.py"]
    assert main(args) == 2
    assert "plug-in failed to load (RuntimeError: plug-in was loaded" in capsys.readouterr().err


def test_an_unknown_name_says_how_to_load_plugins():
    with pytest.raises(InputError, match=r"unknown algorithm 'my_qffl' \(registered: .*--plugin PATH_OR_MODULE, "
                                         r"\$FEDMPI_PLUGINS or a sweep file's plugins:\)"):
        config.from_dict(synthetic_config(algorithm={"name": "my_qffl"}))


@pytest.mark.slow
def test_a_sweep_file_carries_its_own_plugins(tmp_path):
    """plugins: (relative to the sweep file) is loaded by the -j workers, --status and table."""
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "scaled.py").write_text(ALGO)
    write_config(exp / "base.yaml", quadratic("unused.h5", name="scaled_fedavg", scale=0.25))
    (exp / "s.sweep.yaml").write_text(yaml.safe_dump(
        {"base": "base.yaml", "out": "res", "plugins": ["scaled.py"], "grid": {"seed": [0, 1]}}))
    fedmpi(["sweep", "exp/s.sweep.yaml", "-j", "2", "--quiet"])
    assert sorted(glob.glob("*.h5", root_dir=exp / "res")) == ["seed=0.h5", "seed=1.h5"]
    os.chdir(exp)
    assert "2 cells: 2 done" in fedmpi(["sweep", "s.sweep.yaml", "--status"]).stdout
    assert fedmpi(["table", "s.sweep.yaml", "--format", "csv"]).stdout.count("\n") == 2
    (exp / "s.sweep.yaml").write_text(yaml.safe_dump({"base": "base.yaml", "out": "res", "grid": {"seed": [0, 1]}}))
    p = fedmpi(["table", "s.sweep.yaml"], check=False)  # without its plug-in: each cell says why it is left out
    assert p.returncode == 2 and p.stderr.count("--plugin PATH_OR_MODULE") == 2, p.stderr
    assert "unknown algorithm 'scaled_fedavg'" in p.stderr and "no completed runs to tabulate" in p.stderr
    (exp / "s.sweep.yaml").write_text(yaml.safe_dump({"base": "base.yaml", "plugins": "nothere.py"}))
    p = fedmpi(["sweep", "s.sweep.yaml"], check=False)
    assert p.returncode == 2 and "nothere.py: no such plug-in file" in p.stderr
