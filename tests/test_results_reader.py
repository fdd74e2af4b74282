"""Reading result files (results/reader.py, hdf5.py's reading side): damaged and foreign files
give one line and exit 2 in every command that reads them, never a traceback (#38.15)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import re
import time

import h5py
import numpy as np
import pytest
import yaml

from conftest import synthetic_config, write_config
from fake_results import fake_result
from fedmpi.cli import main
from fedmpi.errors import InputError
from fedmpi.results import hdf5

ROUNDS = [0, 2, 4, 6]


def _file(tmp_path, name="r.h5", **over) -> str:
    return fake_result(tmp_path / name, {"round": ROUNDS, "test_acc": [0.1, 0.2, 0.3, 0.4],
                                         "test_loss": [1.0, 0.8, 0.7, 0.6]}, **over)


def _config(f) -> dict:
    return yaml.safe_load(f.attrs["config"])


def _set_config(f, **changes) -> None:
    d = _config(f)
    for k, v in changes.items():
        if v is None:
            d.pop(k, None)
        else:
            d[k] = v
    f.attrs["config"] = yaml.safe_dump(d)


DAMAGE = {
    "seed text in the config": lambda f: _set_config(f, seed="abc"),
    "seed text in the attributes": lambda f: (_set_config(f, seed=None), f.attrs.__setitem__("seed", "x")),
    "round with NaN": lambda f: (f["metrics"].__delitem__("round"),
                                 f["metrics"].create_dataset("round", data=[0, np.nan, 4.0, 6.0])),
    "provenance of the wrong shape": lambda f: f.attrs.update(
        {"fedmpi_source": "x", "inputs": '{"a": 3}', "plugins": '{"p": 5}'}),
    "provenance lists": lambda f: f.attrs.update({"fedmpi_source": "x", "inputs": "[1]", "plugins": "[2]"}),
    "config text with undecodable bytes": lambda f: f.attrs.__setitem__("config", np.bytes_(b"seed: \xff\xfe")),
    "rounds_done text": lambda f: f.attrs.__setitem__("rounds_done", "many"),
}


def _commands(path: str, tmp_path) -> list[list[str]]:
    return [["info", path], ["table", path, "--partial"], ["plot", path, "--out", str(tmp_path / "f.png")],
            ["export", path, "--out", "-"]]


def _one_line_or_ok(args: list[str]) -> int:
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(args)
    lines = [ln for ln in err.getvalue().splitlines() if ln.strip()]
    assert code in (0, 2) and len(lines) == (code == 2), (args, code, lines)
    return code


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_damaged_attributes_are_one_line(tmp_path, damage):
    path = _file(tmp_path)
    with h5py.File(path, "a") as f:
        DAMAGE[damage](f)
    for args in _commands(path, tmp_path):
        _one_line_or_ok(args)


def _corrupt(data: bytes, rng: np.random.Generator) -> bytes:
    b = bytearray(data)
    kind = rng.integers(3)
    if kind == 0:  # a few bytes anywhere
        for _ in range(rng.integers(1, 20)):
            b[rng.integers(len(b))] = rng.integers(256)
    elif kind == 1:  # cut short
        b = b[: rng.integers(len(b))]
    else:  # a block of garbage
        at = rng.integers(len(b) - 64)
        b[at: at + 64] = rng.integers(0, 256, 64, dtype=np.uint8).tobytes()
    return bytes(b)


class _NoWait:
    """``time`` for hdf5.py without the pause between its attempts to open a file (a writer may be
    mid-flush): a damaged file that HDF5 cannot open is tried three times all the same."""

    def __getattr__(self, name: str):
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        pass


@pytest.mark.slow
def test_randomly_damaged_files_are_one_line_or_read(tmp_path, monkeypatch):
    """Bytes flipped, the file cut, a block overwritten: every reading command reads the file or
    says in one line that it cannot (HDF5 raises RuntimeError, OSError, KeyError... from anywhere)."""
    monkeypatch.setattr(hdf5, "time", _NoWait())  # 2 x 0.2 s per unopenable file: 20 of the test's 28 s
    good = _file(tmp_path, "good.h5")
    data = open(good, "rb").read()
    rng = np.random.default_rng(0)
    path = str(tmp_path / "bad.h5")
    for _ in range(40):
        with open(path, "wb") as fh:
            fh.write(_corrupt(data, rng))
        for args in _commands(path, tmp_path) + [["info", path, good]]:
            _one_line_or_ok(args)


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.mark.parametrize("damage", ["status 7", "status array", "flipped", "cut"])
def test_run_out_leaves_a_damaged_file_untouched(tmp_path, capsys, damage):
    """``fedmpi run --out`` on a damaged file (its status no fedmpi status, or its structure
    unreadable) refuses it like a foreign file: exit 2, one line, the file as it was."""
    cfg = synthetic_config(rounds=2)
    path = _file(tmp_path, seed=cfg["seed"])
    if damage.startswith("status"):
        with h5py.File(path, "a") as f:
            f.attrs["status"] = 7 if damage == "status 7" else np.array([1, 2])
    else:
        data = bytearray(open(path, "rb").read())
        if damage == "cut":
            data = data[: len(data) // 2]
        else:
            for i in range(2000, len(data), 97):
                data[i] ^= 0xFF
        open(path, "wb").write(bytes(data))
    before = _digest(path)
    with pytest.raises(InputError, match="not a fedmpi result file"):
        hdf5.claim(path, "digest").release()
    conf = write_config(tmp_path / "c.yaml", cfg)
    assert main(["run", conf, "--out", path, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a fedmpi result file" in err[0], err
    assert _digest(path) == before


def test_the_docs_name_every_status():
    """#35.9: docs/INTERFACES.md listed four statuses where the writer has five (``diverged``)."""
    import os

    from conftest import ROOT

    for page in ("INTERFACES.md", "FILES.md"):
        text = open(os.path.join(ROOT, "docs", page), encoding="utf-8").read()
        row = next(ln for ln in text.splitlines() if ln.startswith("| root attributes"))
        named = set(re.findall(r"`?(\w+)`?", row.split("`status`", 1)[1].split(")", 1)[0]))
        assert set(hdf5.STATUSES) <= named, (page, set(hdf5.STATUSES) - named)


# ----------------------------------------------------------------------------- accessors (#35.6)

def _doc_blocks() -> list[str]:
    import os

    from conftest import ROOT

    text = open(os.path.join(ROOT, "docs", "FILES.md"), encoding="utf-8").read()
    return re.findall(r"```python\n(.*?)```", text, re.S)


@pytest.fixture
def example_run(tmp_path):
    """runs/example.h5 of a real run (in this process) with the mask and per-client arrays."""
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(
        runtime={"progress": False, "log_availability": True}, evaluation={"clients": {"arrays": True}}))
    assert main(["run", cfg, "--out", "runs/example.h5", "--quiet"]) == 0
    return "runs/example.h5"


def test_files_md_example_runs(example_run):
    """The example of docs/FILES.md, as written; its comments' claims checked on the run."""
    numpy_block, pandas_block = _doc_blocks()
    env: dict = {}
    exec(compile(numpy_block, "docs/FILES.md", "exec"), env)
    r, mask, clients = env["r"], env["mask"], env["clients"]
    assert (r.status, r.rounds_done, r.seed) == ("completed", 6, 3)
    assert mask.dtype == np.uint8 and mask.shape == (6, 12) and set(np.unique(mask)) <= {0, 1}
    with h5py.File(example_run) as f:
        assert np.array_equal(mask, f["availability/mask"][:])
        assert np.array_equal(clients["acc"], f["clients/acc"][:])
    assert sorted(clients) == ["acc", "loss"] and clients["acc"].shape == (len(r.metrics["round"]), 12)
    assert env["noise"] is None and env["events"] == {} and env["sizes"].shape == (12,)
    rounds = r.metrics["round"][1:]  # n_active: the clients of the last round before each evaluation
    assert np.array_equal(env["per_round"][rounds - 1], r.metrics["n_active"][1:])
    pd = pytest.importorskip("pandas", reason="the DataFrame part needs the [analysis] extra (pandas)")
    exec(compile(pandas_block, "docs/FILES.md", "exec"), env)
    long, wide = env["long"], env["wide"]
    assert list(long.columns) == ["round", "client", "acc", "loss"] and len(long) == 12 * len(r.metrics["round"])
    assert list(wide.index) == [1, 2, 3, 4, 5, 6] and wide.shape == (6, 12) and isinstance(env["many"], pd.DataFrame)
    row = long[(long["round"] == 6) & (long["client"] == 4)]
    assert row["acc"].item() == clients["acc"][-1, 4]


def test_records_of_any_group(tmp_path):
    """A group a later fedmpi or a plug-in adds (one value per round, or its own round column)
    reads through the same accessors: as arrays, and as a table when pandas is there."""
    path = _file(tmp_path)
    with h5py.File(path, "a") as f:
        f["privacy/noise_multiplier"] = np.array([1.0, 1.1, 1.2])
        f["events/round"] = np.array([2, 5])
        f["events/client"] = np.array([3, 7])
        f["events/nested/x"] = np.zeros((2, 2))
    from fedmpi import results

    r = results.load(path)
    assert list(r.records("privacy")["noise_multiplier"]) == [1.0, 1.1, 1.2]
    assert sorted(r.records("events")) == ["client", "nested.x", "round"] and r.records("nope") == {}
    assert r.clients() == {}
    with pytest.raises(InputError, match="has no /availability/mask .*log_availability"):
        r.mask()
    pd = pytest.importorskip("pandas")
    assert r.records_frame("privacy").to_dict("list") == {"round": [1, 2, 3], "noise_multiplier": [1.0, 1.1, 1.2]}
    with pytest.raises(InputError, match="not a table of one value per row"):
        r.records_frame("events")
    with h5py.File(path, "a") as f:
        del f["events/nested"]
    assert r.records_frame("events").to_dict("list") == {"round": [2, 5], "client": [3, 7]}
    assert isinstance(r.dataframe(), pd.DataFrame)


def test_damaged_groups_are_one_line(tmp_path):
    path = _file(tmp_path)
    with h5py.File(path, "a") as f:
        f["privacy"] = np.zeros(3)  # a dataset where a group belongs
        f["clients/loss"] = np.zeros(4)  # 1-D where evaluations x clients belong
        f["availability/mask"] = np.array([b"x", b"y"])
    from fedmpi import results

    r = results.load(path)
    for call, needle in ((lambda: r.records("privacy"), "/privacy is a dataset"),
                         (r.clients, "/clients/loss has shape (4,)"),
                         (r.mask, "/availability/mask is not numeric")):
        with pytest.raises(InputError, match=re.escape(needle)):
            call()


@pytest.mark.parametrize("damage", ["widths", "empty"])
def test_clients_frame_of_a_damaged_file_is_one_line(tmp_path, damage):
    """#44 (12): per-client arrays of different widths made clients_frame() raise pandas'
    ValueError ("All arrays must be of the same length")."""
    pytest.importorskip("pandas")
    path = _file(tmp_path)
    with h5py.File(path, "a") as f:
        f["clients/loss"] = np.zeros((3, 4))
        f["clients/acc"] = np.zeros((3, 5 if damage == "widths" else 0))
    from fedmpi import results

    with pytest.raises(InputError, match=r"damaged result file \(/clients arrays of different widths: acc \(3, "):
        results.load(path).clients_frame()
