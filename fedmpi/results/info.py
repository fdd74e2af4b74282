"""``fedmpi info RUN.h5 [MORE.h5 ...]``: status, rounds, last metrics and config of runs.

With several files the first line is a verdict: ``identical`` (the same result-defining config,
metric rows and final model, bit for bit; run-only keys, the world size and the machine's metrics
``wall_time``/``peak_rss_mb`` may differ) or what differs from the first file (status, config keys,
metrics with their largest difference, the final model). Then one column per file: status, rounds,
final models, the config keys whose values differ and the last values of the metrics that differ;
``--verbose`` adds every metric's last value and (unless ``--no-config``) the keys they share.
``final params`` is a SHA-256 of ``/final/params`` (its
float32 bytes): two runs with the same digest ended with bit-identical models, and with several
files a line says so or gives the largest difference from the first file. ``made by`` is the
run's provenance (``fedmpi.provenance``): fedmpi's source hash, each plug-in and input file with
its hash, and what of it has changed since. ``privacy`` (runs with ``privacy:``) is the mechanism
and the noise multiplier sigma the rounds used (``/privacy/noise_multiplier``), calibrated to
``privacy.epsilon`` or given, which a paper reports beside epsilon; under ``privacy.noise_cohort_size``
also the multiplier really applied (``/privacy/applied_noise_multiplier``) and which epsilon is whose;
banded_mf's factor and band; whether amplification by sampling was claimed, and why (root attribute
``privacy_amplification``).
"""

from __future__ import annotations

import hashlib
import json

import h5py
import numpy as np

from .. import provenance
from ..errors import InputError
from .hdf5 import open_result
from .reader import Result, is_result_key, load

_SLICE = 1 << 20  # values read at a time: a model of any size costs a few MB here


def _final_params(path: str):
    """The ``/final/params`` dataset of an open result file, or None (read slice by slice)."""
    try:
        f = open_result(path)
    except InputError:  # a run in set-up holds an empty file: no model yet
        return None, None
    try:
        ds = f.get("final/params")
    except (KeyError, TypeError, ValueError, OSError):
        ds = None
    if not isinstance(ds, h5py.Dataset) or ds.ndim != 1 or ds.dtype.kind != "f":
        f.close()
        return None, None
    return f, ds


def params_digest(path: str) -> str | None:
    """``sha256:<first 16 hex digits> (N values)`` of the run's final model, or None before the end."""
    f, ds = _final_params(path)
    if f is None:
        return None
    with f:
        try:
            h = hashlib.sha256()
            for i in range(0, ds.shape[0], _SLICE):
                h.update(np.ascontiguousarray(ds[i: i + _SLICE], dtype=np.float32).tobytes())
        except (OSError, ValueError, RuntimeError) as e:
            raise InputError(f"{path}: damaged result file (/final/params: {str(e)[:80]})") from None
        return f"sha256:{h.hexdigest()[:16]} ({ds.shape[0]} values)"


def params_difference(a: str, b: str) -> str:
    """'identical', 'max |difference| X', or why the two final models cannot be compared."""
    fa, da = _final_params(a)
    fb, db = _final_params(b)
    try:
        if da is None or db is None:
            return "-"
        if da.shape != db.shape:
            return f"different sizes ({da.shape[0]} vs {db.shape[0]})"
        worst, differ = 0.0, False
        for i in range(0, da.shape[0], _SLICE):
            x, y = da[i: i + _SLICE].astype(np.float64), db[i: i + _SLICE].astype(np.float64)
            if not np.array_equal(x, y, equal_nan=True):
                differ = True
                gap = np.abs(x - y)
                worst = max(worst, float(gap[np.isfinite(gap)].max(initial=0.0)))
        return "identical" if not differ else f"max |difference| {worst:.3g}" + ("" if worst else " (NaN/inf)")
    finally:
        for f in (fa, fb):
            if f is not None:
                f.close()


def _num(k: str, val) -> str:
    if k == "round":
        return str(int(val))
    return f"{val:.6g}" if np.isfinite(val) else str(val)


def describe(path: str, show_config: bool = True) -> str:
    r = load(path)
    attrs, metrics = r.attrs, r.metrics
    lines = [f"file:       {path}",
             f"status:     {attrs.get('status')}",
             f"rounds:     {attrs.get('rounds_done')}",
             f"world size: {attrs.get('world_size')}   seed: {attrs.get('seed')}   "
             f"fedmpi {attrs.get('fedmpi_version')}"]
    lines.append(f"final params: {params_digest(path) or '- (not finished)'}")
    lines += made_by(attrs)
    private = privacy_line(r)
    if private:
        lines.append(f"privacy:    {private}")
    used = factor_used(attrs.get("privacy_factor"))
    if used:
        lines.append(f"factor:     {used['factor']} for {used['rounds']} rounds and {used['band']} bands, "
                     f"sha256 {str(used['sha256'])[:16]}")
    n = len(metrics.get("round", []))
    lines.append(f"evaluations: {n}")
    if n:
        lines.append("last metrics:")
        for k, v in metrics.items():
            lines.append(f"  {k:<22} {_num(k, v[-1])}")
    if r.label:
        lines.insert(1, f"label:      {r.label}")
    if show_config and r.config_problem:
        lines.append(f"config:     unreadable ({r.config_problem})")
    elif show_config:
        lines.append("config:")
        lines += ["  " + ln for ln in str(attrs.get("config", "")).rstrip().splitlines()]
    return "\n".join(lines)


def noise_multiplier(r: Result, name: str = "noise_multiplier") -> str:
    """The noise multiplier the run's rounds used (``/privacy/noise_multiplier``, or another record of
    ``/privacy``): one value, or the first and last where a resume changed it; '-' before the first round."""
    sigma = r.records("privacy").get(name)
    sigma = np.asarray([] if sigma is None else sigma, dtype=np.float64).ravel()
    sigma = sigma[np.isfinite(sigma)]  # NaN: rounds of a file from before the record
    if not sigma.size:
        return "-"
    if np.all(sigma == sigma[0]):
        return f"{sigma[0]:.6g}"
    return f"{sigma[0]:.6g} .. {sigma[-1]:.6g} (changed at a resume)"


def factor_used(text: str) -> dict | None:
    """banded_mf's factor as the run used it (the ``privacy_factor`` attribute, JSON: factor,
    rounds, band, sha256); None where it does not read as that."""
    try:
        f = json.loads(text)
        return f if isinstance(f, dict) and {"factor", "rounds", "band", "sha256"} <= set(f) else None
    except (ValueError, TypeError):
        return None


def privacy_line(r: Result) -> str | None:
    """Mechanism (banded_mf: its factor and band), noise multiplier and how it was set, delta,
    accountant, and whether amplification by sampling was claimed and why; None without privacy."""
    flat = r.flat_config()
    mechanism = flat.get("privacy.mechanism")
    if mechanism in (None, "none"):
        return None
    target = flat.get("privacy.epsilon")
    how = f"calibrated to epsilon {target:g} over {flat.get('rounds')} rounds" if isinstance(target, (int, float)) \
        else "given"
    production = flat.get("privacy.noise_cohort_size")
    if production:
        how += (f"; noise as for a cohort of {production}: applied {noise_multiplier(r, 'applied_noise_multiplier')}, "
                f"epsilon this run's, epsilon_production that cohort's")
    used = factor_used(r.attrs.get("privacy_factor"))  # files of an older fedmpi lack it
    factor = (f" (factor {used['factor'] if used else flat.get('privacy.factor', 'sqrt')}, "
              f"band {flat.get('privacy.band', 1)})" if mechanism == "banded_mf" else "")
    amplification = r.attrs.get("privacy_amplification")  # files of an older fedmpi lack it
    return (f"{mechanism}{factor}, noise multiplier {noise_multiplier(r)} ({how}), "
            f"delta {flat.get('privacy.delta', 1e-6):g}, accountant {flat.get('privacy.accountant', 'rdp')}, "
            f"amplification by sampling {amplification or 'not recorded (a file of an older fedmpi)'}")


def made_by(attrs: dict) -> list[str]:
    """The provenance lines of ``describe`` (none for a file of an older fedmpi)."""
    if not attrs.get("fedmpi_source"):
        return []
    try:
        plugins, inputs = (json.loads(attrs.get(k) or "{}") for k in ("plugins", "inputs"))
    except (TypeError, ValueError):
        plugins = inputs = None
    if not all(isinstance(d, dict) and all(isinstance(v, dict) for v in d.values()) for d in (plugins, inputs)):
        return ["made by:    (provenance attributes unreadable)"]
    lines = [f"made by:    fedmpi {attrs.get('fedmpi_version')} source {str(attrs['fedmpi_source'])[:16]}"]
    lines += [f"  plug-in {p.get('path')}  {str(p.get('sha256'))[:16]}" for p in plugins.values()]
    lines += [f"  input   {path}  {fp.get('size')} bytes  {str(fp.get('sha256'))[:16]}" for path, fp in inputs.items()]
    lines.append(f"  changed since: {provenance.outdated(attrs, fedmpi=True) or 'nothing'}")
    return lines


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


#: metrics of how a run went on its machine, not of what it computed: left out of the verdict
MACHINE_METRICS = ("wall_time", "peak_rss_mb")


def _rows_difference(a: np.ndarray | None, b: np.ndarray | None) -> str | None:
    """None when two metric columns are equal (NaN equal to NaN), else how they differ."""
    if a is None or b is None:
        return "in some files only"
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if len(a) == len(b) and np.array_equal(a, b, equal_nan=True):
        return None
    n = min(len(a), len(b))
    gap = np.abs(a[:n] - b[:n])
    worst = gap[np.isfinite(gap)].max(initial=0.0)
    text = f"max |difference| {worst:.3g}" if worst else "NaN/inf apart" if n and not np.array_equal(
        a[:n], b[:n], equal_nan=True) else "the same rows"
    return text + (f", {len(a)} vs {len(b)} evaluations" if len(a) != len(b) else "")


def verdict(runs: list[Result], differ: list[str], params: list[str]) -> tuple[str, dict[str, str]]:
    """The first line of a comparison: identical (the same result-defining config, metric rows and
    final model, bit for bit; run-only keys, the world size and the machine's metrics may differ),
    or what differs from the first file; and {metric: how it differs} of the metrics that do."""
    result_keys = [k for k in differ if k == "seed" or is_result_key(k)]
    names = list(dict.fromkeys(k for r in runs for k in r.metrics if k not in MACHINE_METRICS))
    metrics: dict[str, str] = {}
    for name in names:
        found = [d for r in runs[1:] if (d := _rows_difference(runs[0].metrics.get(name), r.metrics.get(name)))]
        if found:
            metrics[name] = found[0]
    models = [p if p != "-" else "not in every file" for p in params if p != "identical"]
    statuses = list(dict.fromkeys(r.status for r in runs))
    if not result_keys and not metrics and not models and len(statuses) == 1:
        ran = differ + (["world size"] if len({r.attrs.get("world_size") for r in runs}) > 1 else [])
        how = f"; they ran differently in {', '.join(ran)}" if ran else ""
        return (f"identical: the same experiment, metrics and final model, bit for bit "
                f"({', '.join(MACHINE_METRICS)} left out{how})"), metrics
    shown = [f"{k} ({v})" for k, v in list(metrics.items())[:4]] + ([f"{len(metrics) - 4} more"] if len(metrics) > 4
                                                                     else [])
    parts = [f"status {' vs '.join(statuses)}"] if len(statuses) > 1 else []
    parts += [f"config {', '.join(result_keys)}"] if result_keys else []
    parts += [f"metrics {', '.join(shown)}"] if metrics else []
    parts += [f"final model ({models[0] if len(params) == 1 else f'{len(models)} of {len(params)} files'})"] \
        if models else []
    return "differ from the first file: " + "; ".join(parts), metrics


def compare(paths: list[str], show_config: bool = True, verbose: bool = False) -> str:
    """Several result files side by side: a verdict first (``verdict``), then status, rounds, the
    final models, the config keys that differ and the last values of the metrics that differ;
    ``verbose`` adds every metric's last value and (``show_config``) the keys the files share."""
    runs: list[Result] = [load(p) for p in paths]
    flats = [r.flat_config() for r in runs]
    keys = list(dict.fromkeys(k for f in flats for k in f))
    differ = [k for k in keys if len({repr(f.get(k, "-")) for f in flats}) > 1]
    params = [params_difference(paths[0], p) for p in paths[1:]]
    first, differing_metrics = verdict(runs, differ, params)
    blank = [""] * len(runs)
    rows = [["file", *paths],
            ["status", *(r.status for r in runs)],
            ["rounds", *(str(r.rounds_done) for r in runs)],
            ["world size", *(str(r.attrs.get("world_size")) for r in runs)],
            ["final params", *(params_digest(p) or "-" for p in paths)],
            *([["noise multiplier", *(noise_multiplier(r) if privacy_line(r) else "-" for r in runs)]]
              if any(privacy_line(r) for r in runs) else []),
            ["vs first file", "", *params],
            ["differing config keys:", *blank]]
    rows += [[f"  {k}", *(str(f.get(k, "-")) for f in flats)] for k in differ] or [["  (none)", *blank]]
    shown = list(dict.fromkeys(["round", *(k for r in runs for k in r.metrics)])) if verbose else \
        [k for k in differing_metrics]
    if shown:
        rows.append(["last metrics:" if verbose else "differing metrics (last values):", *blank])
    for k in shown:
        rows.append([f"  {k}", *(_num(k, r.metrics[k][-1]) if len(r.metrics.get(k, ())) else "-" for r in runs)])
    lines = [first, *_table(rows)]
    if verbose and show_config:
        lines.append("same in all files:")
        lines += [f"  {k}: {flats[0].get(k)}" for k in keys if k not in differ]
    elif not verbose:
        lines.append("(--verbose: every metric's last value and the config keys the files share)")
    return "\n".join(lines)
