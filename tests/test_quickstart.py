"""launch/quickstart.sh skips the install when this checkout is installed for this Python and
unchanged since (launch/installed.py): #46 (3), a rerun reinstalled with pip every time."""

from __future__ import annotations

import json
import os
import shutil
import sys

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "launch"))
import installed  # noqa: E402


def _checkout(tmp_path, requires: list[str]) -> tuple[str, list[str]]:
    """A copy of the packaging files and an installed fedmpi's metadata (editable, pointing at it)."""
    root = tmp_path / "clone"
    (root / "launch").mkdir(parents=True)
    (root / "fedmpi.egg-info").mkdir()
    for name in installed.WATCHED:
        shutil.copy(os.path.join(ROOT, name), root / name)
    site = tmp_path / "site" / "fedmpi-0.1.0.dist-info"
    site.mkdir(parents=True)
    (site / "METADATA").write_text("Metadata-Version: 2.1\nName: fedmpi\nVersion: 0.1.0\n"
                                   + "".join(f"Requires-Dist: {r}\n" for r in requires))
    (site / "direct_url.json").write_text(json.dumps({"dir_info": {"editable": True}, "url": f"file://{root}"}))
    return str(root), [str(tmp_path / "site")]


def test_an_installed_unchanged_checkout_skips_the_install(tmp_path):
    root, path = _checkout(tmp_path, ["numpy>=1.24", 'mpi4py>=3.1; extra == "mpi"',
                                      'not-a-package-anywhere; extra == "privacy"'])
    assert not installed.check(root, "mpi,data", path)  # nothing recorded yet: install
    installed.record(root, "mpi,data")
    assert installed.check(root, "mpi,data", path)
    assert not installed.check(root, "mpi,data,privacy", path)  # an extra whose package is missing
    assert not installed.check(root, "mpi", path)  # other extras than the install's
    with open(os.path.join(root, "setup.cfg"), "a") as f:
        f.write("# a new dependency, say\n")
    assert not installed.check(root, "mpi,data", path)
    installed.record(root, "mpi,data")
    assert installed.check(root, "mpi,data", path)
    other = _checkout(tmp_path / "elsewhere", ["numpy"])[1]  # this Python's fedmpi is another checkout's
    assert not installed.check(root, "mpi,data", other)
    recorded = json.load(open(os.path.join(root, installed.STAMP)))
    json.dump({**recorded, "python": "/another/python"}, open(os.path.join(root, installed.STAMP), "w"))
    assert not installed.check(root, "mpi,data", path)


def test_quickstart_asks_before_it_installs():
    script = open(os.path.join(ROOT, "launch", "quickstart.sh")).read()
    commands = script[script.index("\nif "):]  # not the comments above them
    assert commands.index("installed.py check") < commands.index("  bash launch/install.sh") < \
        commands.index("installed.py record")
    install = open(os.path.join(ROOT, "launch", "install.sh")).read()
    assert 'extras="mpi,data"' in script and 'extras="mpi,data"' in install  # the extras install.sh installs


@pytest.mark.parametrize("extras", ["", "mpi,data"])
def test_a_checkout_without_an_install_is_not_taken_for_one(tmp_path, extras):
    root, _ = _checkout(tmp_path, [])
    shutil.rmtree(os.path.join(root, "fedmpi.egg-info"))
    installed.record(root, extras)  # no install folder: nothing recorded
    assert not os.path.exists(os.path.join(root, installed.STAMP)) and not installed.check(root, extras, [])
