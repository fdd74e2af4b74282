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
        assert [t.get_text().replace("\n", " ") for t in fig.legends[0].get_texts()] == VARIANTS
        assert fig.legends[0].get_title().get_text() == "mean \u00b1 std of 2 runs"  # said once, not per entry


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


# ----------------------------------------------------------------------------- camera-ready (#35.1)

def _texts_inside(fig) -> None:
    """Everything a drawn figure shows (axes with their tick labels and axis labels, legends,
    title) lies inside it: nothing cut at the edges."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    page = fig.bbox
    shown = [ax.get_tightbbox(renderer) for ax in fig.axes] + [leg.get_window_extent(renderer) for leg in fig.legends]
    shown += [t.get_window_extent(renderer) for t in fig.texts if t.get_text().strip()]
    for box in shown:
        assert page.x0 - 1 <= box.x0 and box.x1 <= page.x1 + 1, (box, page)
        assert page.y0 - 1 <= box.y0 and box.y1 <= page.y1 + 1, (box, page)
    titles = [t.get_window_extent(renderer) for t in fig.texts if t.get_text().strip()]
    titles += [ax.title.get_window_extent(renderer) for ax in fig.axes if ax.get_title()]
    for leg in fig.legends:  # the legend covers no title and no axes
        box = leg.get_window_extent(renderer)
        assert not any(box.overlaps(t) for t in titles), (box, titles)
        assert not any(box.overlaps(ax.get_window_extent(renderer)) for ax in fig.axes), box


@pytest.mark.slow
def test_pdf_fonts_are_truetype_not_type3(tmp_path):
    """Venues refuse Type 3 fonts: every font of the PDF is embedded as TrueType (Type 42)."""
    import re

    path = _sweep(tmp_path)
    out = tmp_path / "f.pdf"
    assert main(["plot", path, "--metric", "test_acc,test_loss", "--size", "column", "--title", "A title",
                 "--out", str(out)]) == 0
    data = out.read_bytes()
    subtypes = set(re.findall(rb"/Subtype\s*/(\w+)", data))
    assert b"Type3" not in subtypes and (b"TrueType" in subtypes or b"CIDFontType2" in subtypes), subtypes
    for ext in (".eps", ".ps"):
        ps = tmp_path / f"f{ext}"
        assert main(["plot", path, "--size", "column", "--out", str(ps)]) == 0
        text = ps.read_bytes()
        assert text.startswith(b"%!PS") and b"/FontType 3" not in text and b"/FontType 42" in text


@pytest.mark.parametrize("metrics, legend, xlabel", [
    ("test_acc", "below", None), ("test_acc,test_loss", "below", None), ("test_acc", "right", None),
    ("test_acc", "below", "communication rounds of federated training")])
def test_no_text_is_cut_at_column_size(tmp_path, metrics, legend, xlabel):
    """Four curves with long names, a title and axis labels at --size column: everything inside
    the 3.4 x 2.6 in figure (long names wrapped, the legend in as many columns as fit)."""
    import matplotlib.pyplot as plt

    path = _sweep(tmp_path)
    runs, labels = plots._gather([path])
    per_metric = [(m, plots.curves_of(runs, m, "round", labels)) for m in metrics.split(",")]
    for _, curves in per_metric:
        for c, name in zip(curves, VARIANTS):
            c.label, c.parts = name, {"label": name}
    fig = plots.figure(per_metric, "round", size=plots.SIZES["column"], legend=legend,
                       title="FedSWE and its baselines on Fashion-MNIST", axes=plots.Axes(xlabel=xlabel))
    try:
        _texts_inside(fig)
        assert tuple(fig.get_size_inches()) == plots.SIZES["column"]  # the size asked for, not grown
    finally:
        plt.close(fig)


def test_curves_stay_apart_in_grayscale(tmp_path):
    """Every curve differs from every other in line style or marker, not only in colour."""
    import matplotlib.pyplot as plt

    path = _sweep(tmp_path)
    runs, labels = plots._gather([path])
    fig = plots.figure([("test_acc", plots.curves_of(runs, "test_acc", "round", labels))], "round")
    try:
        lines = fig.axes[0].get_lines()
        assert len(lines) == 4
        looks = {(str(ln.get_linestyle()), ln.get_marker()) for ln in lines}
        assert len(looks) == 4, looks
        assert fig.axes[0].get_ylabel() == "test accuracy" and fig.axes[0].get_xlabel() == "round"
    finally:
        plt.close(fig)


def _grid_sweep(tmp_path, labels: dict | None = None) -> str:
    """3 variants x 2 local-step counts x 3 seeds, written directly."""
    write_config(tmp_path / "base.yaml", synthetic_config())
    data = {"base": "base.yaml", "out": str(tmp_path / "out"),
            "variants": [{"label": "FedAvg", "algorithm.name": "fedavg_active"},
                         {"label": "FedSWE k=100", "algorithm.name": "fedswe", "algorithm.k": 100},
                         {"label": "MIFA", "algorithm.name": "mifa"}],
            "grid": {"train.local_steps": [1, 5], "seed": [0, 1, 2]}}
    if labels:
        data["labels"] = labels
    path = write_config(tmp_path / "g.sweep.yaml", data)
    sw = sweeps.load(path)
    rng = np.random.default_rng(1)
    for cell in sw.cells:
        cfg = sw.config(cell)
        w = ResultWriter(cell.path, cfg.to_yaml(), cfg.seed, 1, ["test_acc"], cfg.task.clients, False,
                         claim_=claim(cell.path, cfg.resume_digest()))
        for r in range(0, 21, 2):
            w.append({"round": r, "test_acc": float(1 - np.exp(-r / 8) * rng.uniform(0.8, 1.0))}, r)
        w.finish("completed", np.zeros(3), 20)
    return path


def test_grid_legend_has_one_entry_per_value(tmp_path):
    """Variants x a grid key: colour and marker name the variant, the line style the grid value,
    and the legend lists 3 + 2 entries instead of 6 curves."""
    import matplotlib.pyplot as plt

    path = _grid_sweep(tmp_path, labels={"train.local_steps": "local steps"})
    runs, labels = plots._gather([path])
    curves = plots.curves_of(runs, "test_acc", "round", labels)
    assert [c.label for c in curves] == ["FedAvg, local steps=1", "FedAvg, local steps=5",
                                         "FedSWE k=100, local steps=1", "FedSWE k=100, local steps=5",
                                         "MIFA, local steps=1", "MIFA, local steps=5"]
    assert {c.runs for c in curves} == {3}
    fig = plots.figure([("test_acc", curves)], "round", size=plots.SIZES["column"])
    try:
        texts = [t.get_text() for t in fig.legends[0].get_texts()]  # one row per factor (columns fill first)
        assert texts == ["FedAvg", "local steps=1", "FedSWE k=100", "local steps=5", "MIFA", ""]
        lines = fig.axes[0].get_lines()
        assert lines[0].get_color() == lines[1].get_color() != lines[2].get_color()
        assert lines[0].get_linestyle() == lines[2].get_linestyle() != lines[1].get_linestyle()
        _texts_inside(fig)
    finally:
        plt.close(fig)


def test_a_subset_of_a_sweeps_files_keeps_its_variant_labels(tmp_path):
    """#35.1: plotting some of a sweep's files (not the sweep file) named the curves
    'synth (fedswe) algorithm.k=100'; each cell's file records its variant (runtime.label)."""
    import glob

    path = _grid_sweep(tmp_path)
    files = sorted(glob.glob(str(tmp_path / "out" / "FedSWE_k=100" / "*.h5")))
    files += sorted(glob.glob(str(tmp_path / "out" / "MIFA" / "seed=*,train.local_steps=5.h5")))
    curves = plots.curves_of(plots.gather_runs(files), "test_acc", "round")
    assert [c.label for c in curves] == ["FedSWE k=100, local_steps=1", "FedSWE k=100, local_steps=5",
                                         "MIFA, local_steps=5"], [c.label for c in curves]
    assert sweeps.load(path).cells[0].path.endswith("FedAvg/seed=0,train.local_steps=1.h5")


def test_legends_never_show_none(tmp_path):
    """#35.7: a key one algorithm has and another lacks (algorithm.k) showed as 'algorithm.k=None'."""
    from fake_results import fake_result

    for i, over in enumerate([{"algorithm__name": "fedswe", "algorithm__k": 100},
                              {"algorithm__name": "fedswe", "algorithm__k": 0},
                              {"algorithm__name": "fedavg_active"}]):
        fake_result(tmp_path / f"r{i}.h5", {"round": [0, 2], "test_acc": [0.1, 0.5]}, **over)
    curves = plots.curves_of(plots.gather_runs([str(tmp_path)]), "test_acc", "round")
    assert sorted(c.label for c in curves) == ["fedavg_active", "fedswe, k=0", "fedswe, k=100"]


def test_axis_labels_and_limits(tmp_path):
    import matplotlib.pyplot as plt

    path = _sweep(tmp_path)
    runs, labels = plots._gather([path])
    per_metric = [(m, plots.curves_of(runs, m, "round", labels)) for m in ("test_acc", "test_loss")]
    axes = plots.Axes("rounds", ["accuracy", "loss"], (0, 5), (0.1, None))
    fig = plots.figure(per_metric, "round", axes=axes)
    try:
        assert [a.get_ylabel() for a in fig.axes] == ["accuracy", "loss"] and fig.axes[1].get_xlabel() == "rounds"
        assert fig.axes[0].get_xlim() == (0, 5) and fig.axes[0].get_ylim()[0] == 0.1
    finally:
        plt.close(fig)
    assert plots.parse_limits("0.5,", "--ylim") == (0.5, None) and plots.parse_limits(",3", "--xlim") == (None, 3)
    for bad in ("1", "2,1", "a,b", "nan,1"):
        with pytest.raises(Exception, match="--ylim"):
            plots.parse_limits(bad, "--ylim")


def test_ylabel_count_must_match(tmp_path, capsys):
    path = _sweep(tmp_path)
    assert main(["plot", path, "--metric", "test_acc,test_loss", "--ylabel", "a", "--ylabel", "b", "--ylabel", "c",
                 "--out", str(tmp_path / "f.png")]) == 2
    assert "--ylabel: 3 given for 2 subplots" in capsys.readouterr().err


@pytest.mark.parametrize("extra, needle", [
    (["--ylabel", "$x^$"], "--ylabel: '$x^$' is not valid mathtext (matplotlib's TeX between $ signs) at character 2"),
    (["--title", "$\\frac{1}$"], "--title: '$\\frac{1}$' is not valid mathtext"),
    (["--label", "$a_$"] + ["--label", "b"] * 3, "--label: '$a_$' is not valid mathtext"),
    (["--ylabel", "\u6f22 accuracy"], "--ylabel '\u6f22 accuracy': the font has no glyph for '\u6f22' (U+6F22)"),
    (["--size", "0.5,0.5"], "--size: 0.5 x 0.5 in leaves the axes no room beside their texts"),
    (["--logy", "--metric", "shifted"], "--logy: shifted has no positive values to draw on a log axis"),
    (["--logx", "--xlim", "0,4"], "--xlim: a log axis (--logx) needs positive limits"),
    (["--xlim", "1e300,1e308"], "--xlim: finite limits (|limit| <= 1e+200) with LOW < HIGH"),
    (["--title", "x" * 100000], "--title: a text of 100000 characters, more than the 1000 a figure has room for"),
])
def test_what_matplotlib_cannot_draw_is_one_line(tmp_path, extra, needle):
    """#44 (12): '$x^$' printed four lines (a pyparsing error), and matplotlib's own warnings
    (a missing glyph, collapsed axes, no positive values on a log axis, a non-positive log
    limit, ticks that overflow) reached stderr beside exit 0. Each is now one line, exit 2, and
    no figure is written. #44's fresh hostile pass: a title of 100,000 characters ran for minutes."""
    from conftest import cli

    path = _sweep(tmp_path)
    if "shifted" in extra:
        for run, _ in plots.gather_runs([path]):
            import h5py

            with h5py.File(run.path, "a") as f:
                f["metrics/shifted"] = -f["metrics/test_acc"][:]
    p = cli(["plot", path, "--out", str(tmp_path / "f.png"), *extra])
    assert p.returncode == 2 and p.stderr.strip().startswith(f"fedmpi: error: {needle}"), p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "f.png").exists()


def test_valid_mathtext_and_dollars_draw_without_a_word(tmp_path):
    from conftest import cli

    path = _sweep(tmp_path)
    p = cli(["plot", path, "--ylabel", "$\\epsilon$ at \\$3", "--title", "costs $5", "--out", str(tmp_path / "f.png")])
    assert p.returncode == 0 and p.stderr == "" and (tmp_path / "f.png").stat().st_size > 0, p.stderr


def _timed(tmp_path, name: str, times, accs, seed: int = 0, lr: float = 0.1, **over) -> str:
    from fake_results import fake_result

    return fake_result(tmp_path / f"{name}-s{seed}.h5", {"round": list(range(len(times))), "time": list(times),
                                                         "test_acc": list(accs)},
                       seed=seed, train__lr=lr, runtime__label=name, **over)


def _climb(times, start, end, rate):
    return [end - (end - start) * np.exp(-t / rate) for t in times]


def test_time_figures_show_where_the_curves_differ(tmp_path):
    """#46 (1): a method's long tail (to ~5000 virtual s) squeezed the interesting start into a
    sliver of the x axis, and the y axis began at the initial model's accuracy, with the curves'
    plateaus on top of each other. By default a time axis now ends a quarter beyond the time the
    slowest curve settles (95% of its climb) and the y axis shows every curve over at least 90% of
    the shown time; --range all, --xlim and --ylim restore or set them."""
    fast_t, slow_t = np.linspace(0, 300, 31), np.linspace(0, 5000, 101)
    _timed(tmp_path, "fast", fast_t, _climb(fast_t, 0.1, 0.82, 20.0), lr=0.1)
    _timed(tmp_path, "slow", slow_t, _climb(slow_t, 0.1, 0.80, 200.0), lr=0.2)
    runs = plots.gather_runs([str(tmp_path)])
    curves = plots.curves_of(runs, "test_acc", "time")
    settle = -200.0 * np.log(0.05)  # the slow curve's 95% point: 599 s
    fig = plots.figure([("test_acc", curves)], "time")
    lo, hi = fig.axes[0].get_xlim()
    assert lo == 0 and settle <= hi <= 1.25 * settle + 50 < 5000, (lo, hi)
    ylo, yhi = fig.axes[0].get_ylim()
    assert 0.2 < ylo < 0.6 and 0.82 < yhi < 0.86, (ylo, yhi)  # not the initial 0.1
    for c in curves:  # each curve inside the y range over >= 90% of the shown x range
        x = np.linspace(0, min(hi, c.x[-1]), 1000)
        assert np.mean(np.interp(x, c.x, c.mean) >= ylo) >= 0.9, c.label
    everything = plots.figure([("test_acc", curves)], "time", axes=plots.Axes(focus=False))
    assert everything.axes[0].get_xlim()[1] >= 5000 and everything.axes[0].get_ylim()[0] < 0.1
    rounds = plots.figure([("test_acc", plots.curves_of(runs, "test_acc", "round"))], "round")
    assert rounds.axes[0].get_xlim()[1] >= 100  # rounds: all of them, as before
    given = plots.figure([("test_acc", curves)], "time", axes=plots.Axes(xlim=(0, 2000)))
    assert given.axes[0].get_xlim() == (0, 2000) and given.axes[0].get_ylim()[0] > 0.1
    falling = [plots.Curve(c.label, c.x, 1 - c.mean, c.std, c.runs) for c in curves]  # a loss: mirrored
    fig = plots.figure([("test_loss", falling)], "time")
    assert fig.axes[0].get_xlim() == (lo, hi) and np.allclose(fig.axes[0].get_ylim(), (1 - yhi, 1 - ylo))
    from conftest import cli

    for extra in ([], ["--range", "all"], ["--xlim", "0,1000", "--ylim", "0.5,0.9"]):
        p = cli(["plot", str(tmp_path), "--x", "time", "--out", str(tmp_path / "f.png"), *extra])
        assert p.returncode == 0 and p.stderr == "", p.stderr


def test_runs_that_share_a_time_budget_end_together(tmp_path):
    """#46 (1): each curve stopped at its shortest seed's last time; runs given one virtual-time
    budget (runtime.stop_at: {metric: time, value: B}) are drawn to B, every curve reaching it: a
    seed that ended before it (its rounds done) holds its last value, and seeds evaluated at other
    times are interpolated onto one grid."""
    budget = {"metric": "time", "value": 400.0}
    for seed, step in ((0, 37.0), (1, 41.0)):  # stopped at the first evaluation at or after 400 s
        t = np.arange(0, 400 + step, step)
        _timed(tmp_path, "fast", t, _climb(t, 0.1, 0.8, 50.0), seed=seed, runtime__stop_at=budget)
    _timed(tmp_path, "short", [0.0, 100.0, 200.0], [0.1, 0.5, 0.6], lr=0.3, runtime__stop_at=budget)  # rounds done
    runs = plots.gather_runs([str(tmp_path)])
    assert plots.shared_budget(runs, "time") == 400.0 and plots.shared_budget(runs, "round") is None
    curves = plots.curves_of(runs, "test_acc", "time", end=400.0)
    assert {c.label: c.runs for c in curves} == {"fast": 2, "short": 1}
    for c in curves:
        assert c.x[-1] >= 400.0 and np.interp(400.0, c.x, c.mean) > 0.55, c.label
    short = next(c for c in curves if c.label == "short")
    assert np.interp(400.0, short.x, short.mean) == 0.6  # its final model, held to the budget
    fast = next(c for c in curves if c.label == "fast")
    assert len(fast.x) == 200 and fast.x[0] == 0.0  # two time grids: interpolated onto one
    fig = plots.figure([("test_acc", curves)], "time", axes=plots.Axes(budget=400.0))
    assert fig.axes[0].get_xlim() == (0.0, 400.0)
    _timed(tmp_path, "other", [0.0, 500.0], [0.1, 0.7], lr=0.4, runtime__stop_at={"metric": "time", "value": 500.0})
    assert plots.shared_budget(plots.gather_runs([str(tmp_path)]), "time") is None  # budgets differ: none shared
