"""``fedmpi markov-plot``: figures of the minimum-separation Markov sampler (debiasing paper).

- ``fig1``: their Figure 1 study, the l1 distance between pi_R and the uniform distribution
  for a list of R (exact where the chain is small -- R = 0 and R = M - 1 always are --,
  Monte Carlo otherwise);
- ``freq RUN.h5``: each client's share of the participations stored in ``/availability/mask``,
  against pi_R of the run's sampler (``availability.kind: markov``) when its p_i are known.

Shares are drawn as N * share, so 1 is uniform participation.
"""

from __future__ import annotations

import argparse
import os

import h5py
import numpy as np

from ..errors import InputError
from ..participation.markov import chain_shape, check_weights
from ..participation.pi import P_HELP, l1_to_uniform, parse_weights, stationary_exact, stationary_mc
from .outfiles import check_figure, save_figure

CLI_KEYS = {"p": "--p", "B": "--B", "R": "--R", "groups": "--groups"}


# ----------------------------------------------------------------------------- computations

def stationary(p: np.ndarray, B: int, R: int, rounds: int, seed: int, groups: int | None = None,
               max_transitions: int = 500_000) -> tuple[np.ndarray, str]:
    """pi_R and how it was obtained: 'exact' when the chain has at most ``max_transitions``
    transitions (always for R = 0 and R = M - 1), else 'mc' over ``rounds`` rounds."""
    try:
        return stationary_exact(p, B, R, max_states=max_transitions, groups=groups,
                                max_transitions=max_transitions), "exact"
    except InputError as e:
        if not str(e).startswith("max_states:"):
            raise
    return stationary_mc(p, B, R, rounds, seed, groups=groups), "mc"


def figure1_study(p: np.ndarray, B: int, Rs: list[int], rounds: int, seed: int) -> list[tuple[int, float, str]]:
    """(R, ||pi_R - 1/N||_1, 'exact' | 'mc') for each R."""
    out = []
    for R in Rs:
        pi, how = stationary(p, B, R, rounds, seed)
        out.append((R, l1_to_uniform(pi), how))
    return out


def participation_shares(path: str) -> tuple[np.ndarray, int, dict]:
    """From a result file: each client's share of all participations (sums to 1; = frequency / B
    for a fixed |S_t| = B), the number of rounds in the mask, and the stored config (a dict)."""
    from .. import yamlio
    from .hdf5 import open_result

    with open_result(path) as f:
        mask = f.get("availability/mask")
        if not isinstance(mask, h5py.Dataset):
            raise InputError(f"{path}: has no /availability/mask (run with runtime.log_availability: true)")
        if mask.ndim != 2 or mask.shape[0] == 0 or mask.dtype.kind not in "iub":
            raise InputError(f"{path}: /availability/mask holds no participation (shape {mask.shape})")
        counts = np.zeros(mask.shape[1], dtype=np.int64)
        step = max(1, (64 << 20) // max(1, mask.shape[1]))  # 64 MB of rows at a time
        for lo in range(0, mask.shape[0], step):
            try:
                counts += (mask[lo:lo + step] != 0).sum(axis=0, dtype=np.int64)
            except (OSError, RuntimeError, ValueError) as e:
                raise InputError(f"{path}: /availability/mask is damaged near row {lo} "
                                 f"({str(e).splitlines()[0][:80]})") from None
        rounds = mask.shape[0]
        try:
            cfg = yamlio.loads(str(f.attrs.get("config", "")), f"{path}: config") or {}
        except InputError:
            cfg = {}
    if counts.sum() == 0:
        raise InputError(f"{path}: /availability/mask holds no participation (shape {mask.shape})")
    return counts / counts.sum(), rounds, cfg if isinstance(cfg, dict) else {}


def reference_pi(cfg_dict: dict, rounds: int) -> tuple[np.ndarray, str, str] | None:
    """pi_R of a run's Markov sampler (None for other availability kinds): pi, how, a label.

    Monte Carlo uses the run's seed + 1, so the estimate is independent of the run's draws."""
    from .. import config
    from ..participation.probs import base_probabilities
    from ..participation.show import client_info

    cfg = config.from_dict(cfg_dict)
    av = cfg.availability
    if av.kind != "markov":
        return None
    p = base_probabilities(av.base, client_info(cfg))
    pi, how = stationary(p, av.B, av.R, rounds, cfg.seed + 1, groups=av.markov_groups)
    shape = f"M = {av.markov_groups} groups" if av.markov_groups else f"B = {av.B}"
    return pi, how, f"pi_R ({how}), R = {av.R}, {shape}"


# ----------------------------------------------------------------------------- figures

def plot_figure1(rows: list[tuple[int, float, str]], out: str, title: str) -> str:
    """l1 distance to uniform against R; exact points filled, Monte Carlo points hollow."""
    from matplotlib.figure import Figure  # no pyplot: no global backend state

    fig = Figure(figsize=(6.4, 4.2), layout="tight")
    ax = fig.subplots()
    R = np.array([r[0] for r in rows])
    l1 = np.array([r[1] for r in rows])
    exact = np.array([r[2] == "exact" for r in rows])
    ax.plot(R, l1, color="C0", linewidth=1)
    ax.plot(R[~exact], l1[~exact], "o", mfc="white", color="C0", label="Monte Carlo")
    ax.plot(R[exact], l1[exact], "o", color="C0", label="exact")
    ax.set_xlabel("minimum separation R")
    ax.set_ylabel(r"$\|\pi_R - \frac{1}{N}\mathbf{1}\|_1$")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, out, "--out")


def plot_shares(shares: np.ndarray, out: str, title: str, ref: tuple[np.ndarray, str] | None = None) -> str:
    """N * share per client as bars, N * pi_R as markers, 1 = uniform."""
    from matplotlib.figure import Figure

    n = shares.size
    fig = Figure(figsize=(max(6.4, min(16.0, 0.08 * n + 4)), 4.2), layout="tight")
    ax = fig.subplots()
    ids = np.arange(n)
    ax.bar(ids, n * shares, width=0.8, color="C0", alpha=0.6, label="measured (mask)")
    if ref is not None:
        ax.plot(ids, n * ref[0], "_" if n > 40 else "o", color="C3", markersize=8, label=ref[1])
    ax.axhline(1.0, color="k", linewidth=0.8, linestyle="--", label="uniform")
    ax.set_xlabel("client")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_ylabel("N x share of participations")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    return save_figure(fig, out, "--out")


# ----------------------------------------------------------------------------- CLI

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``fedmpi markov-plot {fig1,freq}`` (also sets the handler ``run_cli``)."""
    parser.description = "Figures of the minimum-separation Markov sampler (debiasing paper)."
    parser.set_defaults(_handler=run_cli)
    sub = parser.add_subparsers(dest="markov_plot", required=True, metavar="{fig1,freq}")
    f = sub.add_parser("fig1", help="l1 distance between pi_R and uniform against R (their Figure 1)")
    src = f.add_mutually_exclusive_group()
    src.add_argument("--N", type=int, default=500, help="clients, weights p_i ~ U(0.01, 1) (default 500)")
    src.add_argument("--p", help=P_HELP)
    f.add_argument("--B", type=int, default=1, help="clients per round (default 1)")
    f.add_argument("--R", default=None,
                   help="comma list 'R1,R2,...' or range 'LO:HI:STEP' (HI included); default 0:M-1:(M-1)/10")
    f.add_argument("--rounds", type=int, default=20000, help="Monte Carlo rounds per R (default 20000)")
    f.add_argument("--seed", type=int, default=0, help="seed of the weights and of the chains (default 0)")
    f.add_argument("--out", required=True, help="figure file (.png, .pdf, .svg)")
    q = sub.add_parser("freq", help="per-client participation shares of a run against pi_R")
    q.add_argument("file", help="result file written with runtime.log_availability: true")
    q.add_argument("--rounds", type=int, default=20000,
                   help="Monte Carlo rounds for pi_R when the exact chain is too large (default 20000)")
    q.add_argument("--out", required=True, help="figure file (.png, .pdf, .svg)")


def parse_r_list(text: str, r_max: int) -> list[int]:
    """'0,5,9' or 'LO:HI:STEP' (HI included) -> sorted distinct R values in 0..r_max."""
    try:
        if ":" in text:
            lo, hi, step = (int(x) for x in text.split(":"))
            if step < 1 or hi < lo:
                raise ValueError
            if lo < 0 or hi > r_max:  # before the list is made
                raise InputError(f"--R: values must be in 0..{r_max} (M - 1), got {text!r}")
            Rs = list(range(lo, hi, step)) + [hi]
        else:
            Rs = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--R: expected 'R1,R2,...' or 'LO:HI:STEP' with LO <= HI and STEP >= 1, "
                         f"got {text!r}") from None
    bad = [r for r in Rs if not 0 <= r <= r_max]
    if not Rs or bad:
        raise InputError(f"--R: values must be in 0..{r_max} (M - 1), got {text!r}")
    return sorted(set(Rs))


def run_cli(args: argparse.Namespace) -> int:
    """``fedmpi markov-plot``: write the figure, print a small table. Bad input raises InputError."""
    if args.rounds < 1:
        raise InputError(f"--rounds: must be >= 1, got {args.rounds}")
    check_figure(args.out, "--out", [args.file] if args.markov_plot == "freq" else [])
    if args.markov_plot == "fig1":
        return _fig1(args)
    return _freq(args)


def _fig1(args: argparse.Namespace) -> int:
    if args.p is None and args.N < 1:
        raise InputError(f"--N: must be >= 1, got {args.N}")
    p = parse_weights(args.p if args.p is not None else f"uniform:{args.N}:0.01:1:{args.seed}", None)
    chain_shape(p.size, args.B, 0, None, CLI_KEYS)  # B in 1..N
    check_weights(p, p.size, CLI_KEYS["p"])
    r_max = p.size // args.B - 1
    Rs = parse_r_list(args.R if args.R is not None else f"0:{r_max}:{max(1, r_max // 10)}", r_max)
    rows = figure1_study(p, args.B, Rs, args.rounds, args.seed)
    title = f"N = {p.size}, B = {args.B}, p_i random; Monte Carlo {args.rounds} rounds"
    plot_figure1(rows, args.out, title)
    print(f"{'R':>6} {'l1(pi_R, uniform)':>18}  how")
    for R, l1, how in rows:
        print(f"{R:>6} {l1:>18.4f}  {how}")
    print(f"wrote {args.out}")
    return 0


def _freq(args: argparse.Namespace) -> int:
    shares, rounds, cfg = participation_shares(args.file)
    ref = reference_pi(cfg, args.rounds)
    name = (cfg.get("algorithm") or {}).get("name", "?")
    title = f"{os.path.basename(args.file)} ({name}): {rounds} rounds"
    plot_shares(shares, args.out, title, None if ref is None else (ref[0], ref[2]))
    print(f"rounds in mask: {rounds}; l1(measured, uniform) = {l1_to_uniform(shares):.4f}")
    if ref is not None:
        print(f"l1(pi_R, uniform) = {l1_to_uniform(ref[0]):.4f}; "
              f"l1(measured, pi_R) = {np.abs(shares - ref[0]).sum():.4f} ({ref[1]})")
    print(f"wrote {args.out}")
    return 0
