"""Input files are opened one way (``fedmpi.inputs``): a FIFO, a device or a directory named as an
input is refused with one line before it is opened (#38 item 7: a FIFO as the config, a trace or a
steps file hung set-up for ever and swallowed SIGINT and SIGTERM)."""

from __future__ import annotations

import os

import pytest

from conftest import cli, fedmpi, synthetic_config, write_config
from helpers.deadline import deadline
from fedmpi import inputs
from fedmpi.errors import InputError


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return str(path)


def test_open_input_refuses_what_is_not_a_regular_file(tmp_path, fifo):
    with pytest.raises(InputError, match=rf"^k\.ey: {fifo}: is a FIFO \(named pipe\), expected a trace \(a regular"):
        inputs.open_input(fifo, "trace", "k.ey")
    with pytest.raises(InputError, match=r"^/dev/zero: is a character device, expected a steps file"):
        inputs.read_input("/dev/zero", "steps file")
    with pytest.raises(InputError, match=rf"^{tmp_path}: is a directory"):
        inputs.check_regular(str(tmp_path), "config file")
    (tmp_path / "big").write_bytes(b"x" * 2000)
    with pytest.raises(InputError, match=r"big: trace of 2000 bytes is larger than the 1000 bytes allowed$"):
        inputs.read_input(str(tmp_path / "big"), "trace", limit=1000)
    link = tmp_path / "link"
    link.symlink_to(fifo)  # a link is followed: what it names is checked
    with pytest.raises(InputError, match="is a FIFO"):
        inputs.read_input(str(link), "config file")
    with pytest.raises(FileNotFoundError):  # the caller's own message says what the file should be
        inputs.read_input(str(tmp_path / "nope"), "config file")
    assert inputs.read_input(str(tmp_path / "big"), "trace", limit=2000) == b"x" * 2000


@pytest.mark.parametrize("where", ["config", "trace", "steps", "graph", "leaf", "idx",
                                   pytest.param("plugin", marks=pytest.mark.slow), "sweep"])
def test_a_fifo_input_is_one_line_not_a_hang(tmp_path, fifo, where):
    cfg = synthetic_config()
    args = []
    if where == "trace":
        cfg["availability"] = {"kind": "trace", "trace": fifo}
    elif where == "steps":
        cfg["train"]["local_steps_file"] = fifo
    elif where == "graph":
        cfg["algorithm"] = {"name": "dgd"}
        cfg["availability"] = {"kind": "always"}
        cfg["topology"] = {"kind": "file", "file": fifo}
    elif where == "leaf":
        cfg["task"].update(dataset="leaf", partition={"kind": "natural"}, leaf={"train": fifo, "test": fifo})
    elif where == "idx":
        root = tmp_path / "fm"
        root.mkdir()
        os.mkfifo(root / "train-images-idx3-ubyte.gz")  # no fall-back to synthetic data: it is there
        cfg["task"].update(dataset="fmnist", root=str(root))
    elif where == "plugin":
        os.rename(fifo, tmp_path / "plug.py")
        fifo = str(tmp_path / "plug.py")
        args = ["--plugin", fifo]
    path = write_config(tmp_path / "c.yaml", cfg)
    cmd = ["run", fifo if where == "config" else path, "--quiet", *args]
    if where == "sweep":
        cmd = ["sweep", fifo, "--quiet"]
    if where == "plugin":  # a plug-in is imported in its own process (it would stay registered here)
        p = fedmpi(cmd, check=False, timeout=120)
    else:
        with deadline(120):
            p = cli(cmd)
    assert p.returncode == 2, p.stderr
    errors = [ln for ln in p.stderr.splitlines() if not ln.startswith("notice:")]
    assert len(errors) == 1 and "is a FIFO (named pipe)" in errors[0] and "Traceback" not in p.stderr
    assert (os.path.basename(fifo) if where != "idx" else "train-images-idx3-ubyte.gz") in p.stderr
