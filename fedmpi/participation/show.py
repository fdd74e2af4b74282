"""``fedmpi availability CONFIG.yaml``: preview p_i^t and sampled availability without training.

Prints a table (default), JSON (``--json``) or writes a plot like the FedSWE paper's Fig. 16
(``--out FIG.png``: p_i^t on top, the sampled availability of each client below).
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Callable, Sequence

import numpy as np

from ..config import Config, load
from ..errors import InputError
from ..registry import AVAILABILITY
from .base import ClientInfo, Participation, build
from .probs import WithBaseParams

InfoLoader = Callable[[Config], ClientInfo]
MAX_ROUNDS = 100_000  # a preview: one sampler step per round, in Python
MAX_SHOWN_CLIENTS = 100


def trajectories(part: Participation, rounds: int, clients: Sequence[int]) -> np.ndarray:
    """(len(clients), rounds) p_i^t; NaN in rounds where the model has no probabilities."""
    idx = np.asarray(clients, dtype=np.int64)
    out = np.full((idx.size, rounds), np.nan)
    for t in range(rounds):
        p = part.probabilities(t)
        if p is not None:
            out[:, t] = p[idx]
    return out


def simulate(part: Participation, rounds: int, clients: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
    """Draw rounds 0..rounds-1 (``part`` must be fresh): per-client availability counts (m,)
    and the 0/1 availability of ``clients`` (len(clients), rounds)."""
    idx = np.asarray(clients, dtype=np.int64)
    counts = np.zeros(part.m, dtype=np.int64)
    sel = np.zeros((idx.size, rounds), dtype=np.uint8)
    for t in range(rounds):
        ids = part.available(t)
        counts[ids] += 1
        sel[:, t] = np.isin(idx, ids)
    return counts, sel


def client_info(cfg: Config, loader: InfoLoader | None = None) -> ClientInfo:
    """What the participation model needs; loads the data partition only when it must."""
    av = cfg.availability
    needs_data = (not AVAILABILITY.get(av.kind).builtin  # a plug-in kind: give it everything
                  or (isinstance(av, WithBaseParams) and av.base.kind == "dirichlet_phi")  # histograms
                  or (av.kind == "periodic_groups" and cfg.task.partition.kind == "groups"))  # data groups
    if not needs_data:
        return ClientInfo(m=cfg.task.clients, seed=cfg.seed)
    if loader is None:
        from ..build import client_info as loader  # lazy: reads the dataset
    return loader(cfg)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``fedmpi availability``."""
    parser.add_argument("config", help="experiment YAML")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a dotted config key (repeatable)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds to show (default: 40, or two periods of a kind with availability.period)")
    parser.add_argument("--clients", default=None, help="comma-separated client ids (default: 0,1,2)")
    parser.add_argument("--out", default=None, help="write a PNG plot here")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")


def default_rounds(cfg: Config) -> int:
    """40 rounds, or two periods of a kind that has one (``availability.period``; only some kinds
    declare it), whichever is longer."""
    period = getattr(cfg.availability, "period", None)
    return max(40, 2 * period) if isinstance(period, int) else 40


def _parse_clients(text: str | None, m: int) -> list[int]:
    if text is None:
        return list(range(min(m, 3)))
    try:
        ids = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--clients: expected comma-separated integers, got {text!r}") from None
    bad = [i for i in ids if not 0 <= i < m]
    if not ids or bad:
        raise InputError(f"--clients: ids must be in [0, {m}) (task.clients), got {text!r}")
    if len(ids) > MAX_SHOWN_CLIENTS:
        raise InputError(f"--clients: at most {MAX_SHOWN_CLIENTS} clients, got {len(ids)}")
    return ids


def run_cli(args: argparse.Namespace, loader: InfoLoader | None = None) -> int:
    """Run ``fedmpi availability``; InputError (exit 2) on bad input. ``loader`` builds the ClientInfo."""
    if args.out:
        from ..results.outfiles import check_figure

        check_figure(args.out, "--out", [args.config])
    cfg = load(args.config, getattr(args, "set", None) or [])
    rounds = args.rounds if args.rounds is not None else default_rounds(cfg)
    if not 1 <= rounds <= MAX_ROUNDS:
        raise InputError(f"--rounds: must be in 1..{MAX_ROUNDS}, got {rounds}")
    clients = _parse_clients(args.clients, cfg.task.clients)
    info = client_info(cfg, loader)
    p = trajectories(build(cfg.availability, info), rounds, clients)
    _, avail = simulate(build(cfg.availability, info), rounds, clients)
    base = getattr(cfg.availability, "base", None)  # kinds without base probabilities: always, cohort, traces
    title = f"availability {cfg.availability.kind}{f' (base {base.kind})' if base else ''}, seed {cfg.seed}"
    if args.out:
        _plot(args.out, title, clients, p, avail, [args.config])
    if args.json:
        print(json.dumps({
            "kind": cfg.availability.kind, "base": base.kind if base else None, "seed": cfg.seed,
            "rounds": rounds, "clients": clients,
            "p": [[None if math.isnan(v) else round(float(v), 6) for v in row] for row in p],
            "available": avail.tolist(), "frequency": avail.mean(axis=1).tolist()}))
    elif args.out:
        print(f"wrote {args.out}")
    else:
        _table(title, clients, p, avail)
    return 0


def _table(title: str, clients: list[int], p: np.ndarray, avail: np.ndarray) -> None:
    print(f"{title}; * = available")
    print("round " + "".join(f"{'client ' + str(c):>12}" for c in clients))
    for t in range(p.shape[1]):
        cells = ("       -" if math.isnan(v) else f"{v:8.4f}" for v in p[:, t])
        print(f"{t:5d} " + "".join(f"{c}{'*' if a else ' ':<4}" for c, a in zip(cells, avail[:, t])))
    print("freq  " + "".join(f"{f:8.4f}    " for f in avail.mean(axis=1)))


_LINES = 8  # more clients than this are drawn as quantile bands, not one line each


def _plot(path: str, title: str, clients: list[int], p: np.ndarray, avail: np.ndarray, inputs: list[str]) -> None:
    from ..results.outfiles import save_figure

    save_figure(figure(title, clients, p, avail), path, "--out", inputs)


def figure(title: str, clients: list[int], p: np.ndarray, avail: np.ndarray):
    """p_i^t on top (one line per client, or for many clients the median and the 10-90% and
    25-75% bands over them, with a legend beside the axes), the sampled availability below."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state (renders with Agg)

    many = len(clients) > _LINES
    fig = Figure(figsize=(9, 3.0 + (1.2 if many else 0.35 * len(clients))), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=[2, 1])
    t = np.arange(p.shape[1])
    if np.isnan(p).all():
        top.text(0.5, 0.5, "no $p_i^t$ (not a Bernoulli model)", ha="center", transform=top.transAxes)
    elif many:
        q10, q25, q50, q75, q90 = np.nanquantile(p, [0.1, 0.25, 0.5, 0.75, 0.9], axis=0)
        top.fill_between(t, q10, q90, step="post", color="tab:blue", alpha=0.2, linewidth=0,
                         label=f"10-90% of {len(clients)} clients")
        top.fill_between(t, q25, q75, step="post", color="tab:blue", alpha=0.35, linewidth=0, label="25-75%")
        top.step(t, q50, where="post", color="tab:blue", label="median")
        for c, row in list(zip(clients, p))[:2]:
            top.step(t, row, where="post", linewidth=0.8, linestyle="--", label=f"client {c}")
    else:
        colors = [f"C{i}" for i in range(10)]
        for i, (row, c) in enumerate(zip(p, clients)):
            top.step(t, row, where="post", color=colors[i % 10], label=f"client {c}")
    top.set_ylim(-0.02, 1.02)
    top.set_ylabel("$p_i^t$")
    top.set_title(title)
    if not np.isnan(p).all():
        fig.legend(*top.get_legend_handles_labels(), loc="outside right upper", fontsize="small")
    bottom.imshow(avail, aspect="auto", interpolation="nearest", cmap="Blues", vmin=0, vmax=1,
                  extent=(-0.5, p.shape[1] - 0.5, len(clients) - 0.5, -0.5))
    if not many:
        bottom.set_yticks(range(len(clients)), [str(c) for c in clients])
    bottom.set_ylabel("client" if not many else f"{len(clients)} clients")
    bottom.set_xlabel("round")
    return fig
