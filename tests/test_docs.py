"""The README's generated config reference matches fedmpi/config.py."""

import os

from conftest import ROOT
from fedmpi.docs import END, START, config_table


def test_readme_config_reference_is_current():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    block = text.split(START, 1)[1].split(END, 1)[0].strip()
    assert block == config_table(), "run: python -m fedmpi.docs"


def test_readme_starts_with_the_two_commands():
    lines = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().splitlines()
    cmds = [ln for ln in lines[:8] if ln.startswith("bash ")]
    assert cmds[0].startswith("bash launch/quickstart.sh") and cmds[1].startswith("bash launch/test.sh")
    ci = open(os.path.join(ROOT, ".ci/run"), encoding="utf-8").read()
    assert "bash launch/test.sh" in ci
