"""``fedmpi plot``: figures of files, folders and sweeps that a paper can use (no training)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import synthetic_config, write_config
from fedmpi import sweep as sweeps
from fedmpi.cli import main
from fedmpi.results import plot as plots
from fedmpi.results.hdf5 import ResultWriter, claim

VARIANTS = ["FedAvg over active clients", "FedSWE k=100 (adaptive echo)", "MIFA with a long label",
            "FedVARP"]


def _sweep(tmp_path) -> str:
    """A 4-variant x 2-seed sweep whose cells are written directly (as a finished sweep leaves them)."""
    write_config(tmp_path / "base.yaml", synthetic_config())
    path = write_config(tmp_path / "s.sweep.yaml", {
        "base": "base.yaml", "out": str(tmp_path / "out"),
        "variants": [{"label": f"v{i}", "train.lr": 0.05 * (i + 1)} for i in range(4)],
        "grid": {"seed": [0, 1]}})
    sw = sweeps.load(path)
    rng = np.random.default_rng(0)
    for cell in sw.cells:
        cfg = sw.config(cell)
        w = ResultWriter(cell.path, cfg.to_yaml(), cfg.seed, 1, ["test_acc", "test_loss"], cfg.task.clients, False,
                         claim_=claim(cell.path, cfg.resume_digest()))
        for r in (0, 2, 4, 6):
            acc = float(rng.uniform(0.2, 0.9))
            w.append({"round": r, "test_acc": acc, "test_loss": 1 - acc}, r)
        w.finish("completed", np.zeros(3), 6)
    return path


def test_four_variant_sweep_legend_covers_nothing(tmp_path):
    path = _sweep(tmp_path)
    runs = plots.gather_runs([path])
    curves = plots.curves_of(runs, "test_acc", "round")
    assert [c.label for c in curves] == ["v0", "v1", "v2", "v3"] and {c.runs for c in curves} == {2}
    for c, name in zip(curves, VARIANTS):
        c.label = name
    for size in (plots.SIZES["column"], plots.SIZES["default"]):
        fig = plots.figure([("test_acc", curves)], "round", size=size)
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        legend = fig.legends[0].get_window_extent(renderer)
        axes = fig.axes[0].get_window_extent(renderer)
        page = fig.bbox
        assert page.x0 - 1 <= legend.x0 and legend.x1 <= page.x1 + 1, (legend, page)
        assert page.y0 - 1 <= legend.y0 and legend.y1 <= page.y1 + 1, (legend, page)
        assert not legend.overlaps(axes), (legend, axes)
        assert [t.get_text() for t in fig.legends[0].get_texts()] == [f"{v} (2 runs)" for v in VARIANTS]


def test_cli_sweep_labels_subplots_pdf(tmp_path):
    path = _sweep(tmp_path)
    out = tmp_path / "f.pdf"
    args = ["plot", path, "--metric", "test_acc,test_loss", "--size", "column", "--logy", "--title", "t",
            "--out", str(out)] + [a for v in VARIANTS for a in ("--label", v)]
    assert main(args) == 0
    assert out.read_bytes().startswith(b"%PDF")
    assert main(["plot", str(tmp_path / "out"), "--legend", "right", "--out", str(tmp_path / "f.svg")]) == 0
    assert b"<svg" in (tmp_path / "f.svg").read_bytes()[:500]


@pytest.mark.parametrize("extra, needle", [
    (["--label", "only one"], "--label: 1 given for 4 curves"),
    (["--legend", "sideways"], "--legend: one of"),
    (["--size", "huge"], "--size: column, page"),
    (["--size", "100,1"], "--size: width and height"),
    (["--metric", "nope"], "has no metric 'nope'"),
])
def test_bad_plot_arguments_exit_2(tmp_path, capsys, extra, needle):
    path = _sweep(tmp_path)
    assert main(["plot", path, "--out", str(tmp_path / "f.png"), *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err


def test_bad_figure_format(tmp_path, capsys):
    path = _sweep(tmp_path)
    assert main(["plot", path, "--out", str(tmp_path / "f.txt")]) == 2
    assert "a figure file must end in .png, .pdf, .svg" in capsys.readouterr().err


def test_availability_figure_of_many_clients_draws_bands(tmp_path):
    """``fedmpi availability --clients`` with 30 clients: quantile bands and two sample clients
    instead of 30 lines in repeating colours, the legend beside the axes, covering nothing."""
    from fedmpi.participation import show

    rng = np.random.default_rng(1)
    clients = list(range(30))
    p = rng.uniform(0.1, 0.9, (30, 40))
    fig = show.figure("t", clients, p, (rng.uniform(size=(30, 40)) < p).astype(np.uint8))
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig).draw()
    renderer = fig.canvas.get_renderer()
    legend = fig.legends[0]
    assert len(legend.get_texts()) == 5  # 10-90%, 25-75%, median, two sample clients
    box = legend.get_window_extent(renderer)
    assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes)
    assert fig.bbox.x0 - 1 <= box.x0 and box.x1 <= fig.bbox.x1 + 1
    few = show.figure("t", [0, 1, 2], p[:3], np.zeros((3, 40), np.uint8))
    assert len(few.legends[0].get_texts()) == 3
