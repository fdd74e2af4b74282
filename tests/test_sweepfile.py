"""Sweep files as the result commands read them (results/sweepfile.py): cells' names, labels."""

from __future__ import annotations

import pytest

from conftest import synthetic_config, write_config
from fedmpi.errors import InputError
from fedmpi.results import sweepfile


def _sweep(tmp_path, **top) -> str:
    write_config(tmp_path / "base.yaml", synthetic_config())
    return write_config(tmp_path / "s.sweep.yaml", {"base": "base.yaml", "out": str(tmp_path / "out"), **top})


def test_grid_values_with_one_file_name_are_named(tmp_path):
    """#38.17: two grid values that make one file name asked for variant labels (there were none)."""
    path = _sweep(tmp_path, grid={"name": ["a/b", "a_b"], "seed": [0, 1]})
    with pytest.raises(InputError) as e:
        sweepfile.load(path, validate=False)
    assert "grid.name: 'a/b' and 'a_b' give one file name (a_b)" in str(e.value)
    assert "label" not in str(e.value)


def test_variant_labels_with_one_file_name_ask_for_labels(tmp_path):
    path = _sweep(tmp_path, variants=[{"label": "fed avg", "train.lr": 0.1}, {"label": "fed_avg", "train.lr": 0.2}])
    with pytest.raises(InputError, match=r"cells 0 and 1 get the same file name 'fed_avg'; give the variants "
                                         r"distinct labels \('fed avg' and 'fed_avg' read the same as file names\)"):
        sweepfile.load(path, validate=False)


def test_a_cell_with_damaged_provenance_is_outdated_not_a_traceback(tmp_path, capsys):
    """#38.15: provenance attributes of the wrong shape (a list where a mapping belongs) made
    the cell's state a traceback in fedmpi sweep --status and fedmpi table."""
    import h5py
    import numpy as np

    from fedmpi.cli import main
    from fedmpi.results.hdf5 import ResultWriter, claim

    path = _sweep(tmp_path, grid={"seed": [0]})
    sweep = sweepfile.load(path)
    cell = sweep.cells[0]
    cfg = sweep.config(cell)
    w = ResultWriter(cell.path, cfg.to_yaml(), cfg.seed, 1, ["test_acc"], cfg.task.clients, False,
                     claim_=claim(cell.path, cfg.resume_digest()))
    w.append({"round": 0, "test_acc": 0.5}, 0)
    w.finish("completed", np.zeros(3), 0)
    with h5py.File(cell.path, "a") as f:
        f.attrs.update({"fedmpi_source": "x", "plugins": "[2]", "inputs": '{"a": 3}'})
    assert sweepfile.cell_state(cell)[0] == "outdated"
    assert "provenance attributes are unreadable" in sweepfile.why_outdated(cell)
    assert main(["table", path]) == 2
    assert "left out" in capsys.readouterr().err
