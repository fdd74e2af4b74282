"""pi_R: the long-run participation frequency of each client under the minimum-separation chain.

pi_R^i = lim (fraction of rounds in which client i participates) / B, so sum_i pi_R^i = 1.

- ``stationary_exact``: the paper's order-1 chain Y_t = (S_{t-1}, ..., S_{t-R}) over the last R
  selected sets, a sparse transition matrix P_R, its stationary vector zeta_R^T = zeta_R^T P_R,
  and pi_R^T = zeta_R^T Q_R (the distribution of the next selected set). Sets are unordered here:
  the paper's ordered B-tuples carry the same information (every order is equally likely).
  The stationary vector comes from power iteration on the lazy chain in numpy (no scipy).
- ``stationary_mc``: run the sampler (``Markov``) and count.
- ``figure1``: the paper's Figure 1 study, l1 distance to uniform as R grows.
- ``add_arguments`` / ``run_cli``: ``fedmpi pi``.
"""

from __future__ import annotations

import argparse
import itertools
from array import array
import json
import math

import numpy as np

from .. import rng
from ..errors import InputError
from .markov import Markov, chain_shape, check_weights

PARAM_KEYS = {"p": "p", "B": "B", "R": "R", "groups": "groups"}
CLI_KEYS = {"p": "--p", "B": "--B", "R": "--R", "groups": "--groups"}


# ----------------------------------------------------------------------------- exact

def state_space_size(units: int, per_round: int, R: int) -> int:
    """Number of states of Y_t: sequences of R disjoint ``per_round``-subsets of ``units``."""
    return math.prod(math.comb(units - k * per_round, per_round) for k in range(R))


def _transitions(w: np.ndarray, b: int, R: int) -> tuple[int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The chain as sparse triplets: n_states, then src, dst, prob and the new set's members per transition.

    A state is a tuple (S_1, ..., S_R) of sorted tuples, S_1 the most recent set. From it the
    next set S is any b-subset of the eligible units E, with
    P(S) = sum_{i in S} w_i / (C(|E| - 1, b - 1) * sum_{i in E} w_i), and the state becomes
    (S, S_1, ..., S_{R-1}). Plain Python per transition (about a microsecond each).
    """
    n, wl = w.size, w.tolist()
    index: dict[tuple, int] = {}

    def enumerate_states(prefix: tuple, used: frozenset) -> None:
        if len(prefix) == R:
            index[prefix] = len(index)
            return
        for s in itertools.combinations([u for u in range(n) if u not in used], b):
            enumerate_states(prefix + (s,), used.union(s))

    enumerate_states((), frozenset())
    src, dst, prob, members = array("q"), array("q"), array("d"), array("q")
    for state, i in index.items():
        used = set().union(*state)
        eligible = [u for u in range(n) if u not in used]
        norm = math.comb(len(eligible) - 1, b - 1) * math.fsum(wl[u] for u in eligible)
        for s in itertools.combinations(eligible, b):
            src.append(i)
            dst.append(index[(s,) + state[: R - 1]] if R else 0)
            prob.append(math.fsum(wl[u] for u in s) / norm)
            members.extend(s)
    as_np = lambda a: np.frombuffer(a, dtype=a.typecode)  # noqa: E731
    return len(index), as_np(src), as_np(dst), as_np(prob), as_np(members).reshape(-1, b)


def _stationary_vector(n_states: int, src: np.ndarray, dst: np.ndarray, prob: np.ndarray,
                       max_iter: int = 1_000_000) -> np.ndarray:
    """zeta with zeta^T P = zeta^T, sum 1, for an irreducible chain given as sparse triplets.

    Power iteration on the lazy chain (P + I) / 2 (same stationary vector, aperiodic), run
    until the l1 change per step reaches the rounding floor.
    """
    zeta = np.full(n_states, 1.0 / n_states)
    change = np.inf
    for _ in range(max_iter):
        new = 0.5 * (zeta + np.bincount(dst, weights=zeta[src] * prob, minlength=n_states))
        change, last = np.abs(new - zeta).sum(), change
        zeta = new
        if change < 1e-15 or (change < 1e-13 and change >= last):  # converged, or at the floor
            return zeta / zeta.sum()
    raise RuntimeError(f"pi: power iteration did not converge in {max_iter} steps (l1 change {change:.1e})")


def stationary_exact(p: np.ndarray, B: int, R: int, max_states: int = 200_000,
                     groups: int | None = None, max_transitions: int = 5_000_000) -> np.ndarray:
    """Exact pi_R (length N, sums to 1) from the stationary vector of the order-1 chain.

    Refuses (InputError) when the chain has more than ``max_states`` states or
    ``max_transitions`` non-zero transition probabilities; both are counted before building.
    When N = (R + 1) B (R = M - 1) the chain is a union of deterministic cycles in which every
    client participates exactly once every R + 1 rounds, so pi_R is uniform (returned directly).
    """
    p = np.asarray(p, dtype=np.float64).reshape(-1)
    units, b, size = chain_shape(p.size, B, R, groups, PARAM_KEYS)
    w = check_weights(p, p.size, PARAM_KEYS["p"]).reshape(units, size).sum(axis=1)
    if units == (R + 1) * b:
        return np.full(p.size, 1.0 / p.size)
    n_states = state_space_size(units, b, R)
    n_trans = n_states * math.comb(units - R * b, b)
    if n_states > max_states or n_trans > max_transitions:
        raise InputError(f"max_states: the exact chain over the last R = {R} selected sets has "
                         f"{n_states:,} states and {n_trans:,} transitions (limits {max_states:,} and "
                         f"{max_transitions:,}); use the Monte Carlo estimate (--mc ROUNDS) instead")
    n_states, src, dst, prob, members = _transitions(w, b, R)
    zeta = _stationary_vector(n_states, src, dst, prob)
    # pi_R^T = zeta^T Q_R: probability that unit i is in the next selected set, divided by b
    pi_units = np.bincount(members.ravel(), weights=np.repeat(zeta[src] * prob, b), minlength=units) / b
    return np.repeat(pi_units, size) / size


# ----------------------------------------------------------------------------- Monte Carlo

def stationary_mc(p: np.ndarray, B: int, R: int, rounds: int, seed: int,
                  groups: int | None = None) -> np.ndarray:
    """Monte Carlo pi_R: run the sampler from an empty history for ``rounds`` rounds and count."""
    if rounds < 1:
        raise InputError(f"rounds: must be >= 1, got {rounds}")
    chain = Markov(p, B, R, seed, groups=groups, keys=PARAM_KEYS)
    counts = np.zeros(chain.m, dtype=np.int64)
    for t in range(rounds):
        counts[chain.available(t)] += 1
    return counts / (rounds * chain.clients_per_round)


def l1_to_uniform(pi: np.ndarray) -> float:
    """||pi - (1/N) 1||_1."""
    pi = np.asarray(pi, dtype=np.float64)
    return float(np.abs(pi - 1.0 / pi.size).sum())


def figure1(p: np.ndarray, B: int, Rs: list[int], rounds: int, seed: int) -> list[float]:
    """The paper's Figure 1: Monte Carlo l1 distance between pi_R and uniform for each R."""
    return [l1_to_uniform(stationary_mc(p, B, R, rounds, seed)) for R in Rs]


# ----------------------------------------------------------------------------- CLI

P_HELP = ("client weights p_i: a comma list 'P1,P2,...', or 'uniform:N:LO:HI[:SEED]' "
          "(N weights drawn from U(LO, HI)); every p_i must be > 0")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``fedmpi pi``."""
    parser.description = ("Stationary participation pi_R of the minimum-separation chain "
                          "(long-run participation frequency / B; sums to 1).")
    src = parser.add_mutually_exclusive_group(required=True)
    src.add_argument("--p", help=P_HELP)
    src.add_argument("--p-file", help="file of weights p_i, separated by spaces, commas or newlines "
                                      "('#' starts a comment)")
    parser.add_argument("--B", type=int, default=1, help="clients per round (default 1)")
    parser.add_argument("--R", type=int, default=0,
                        help="minimum separation in rounds, 0..N/B-1 (0..M-1 with --groups; default 0)")
    parser.add_argument("--groups", type=int, default=None,
                        help="M: run the chain over M contiguous groups, one whole group per round (--B ignored)")
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--exact", action="store_true", help="exact stationary solve (default; small N, B, R)")
    how.add_argument("--mc", type=int, metavar="ROUNDS", help="Monte Carlo estimate over ROUNDS rounds")
    parser.add_argument("--seed", type=int, default=0, help="seed of the Monte Carlo chain (default 0)")
    parser.add_argument("--max-states", type=int, default=200_000,
                        help="refuse --exact above this many chain states (default 200000)")
    parser.add_argument("--json", action="store_true",
                        help='print {"pi": [...], "l1_to_uniform": float} instead of a table')


MAX_WEIGHTS = 1_000_000  # clients of the command-line tools (a weights file is at most 32 MiB)


def parse_weights(spec: str | None, path: str | None) -> np.ndarray:
    """The weights from ``--p`` or ``--p-file`` (InputError naming the argument when malformed
    or more than MAX_WEIGHTS). Only their ratios matter: weights whose sum would overflow are
    divided by the largest."""
    p = _parse_weights(spec, path)
    with np.errstate(over="ignore"):
        if np.isfinite(p).all() and not np.isfinite(p.sum()):
            p = p / p.max()
    return p


def _parse_weights(spec: str | None, path: str | None) -> np.ndarray:
    if path is not None:
        from ..yamlio import read_text

        data = read_text(path, "weights file", 32 * 2**20)
        if len(data) > 32 * 2**20:
            raise InputError(f"{path}: weights file larger than the 32 MiB allowed")
        lines = data.decode("utf-8", errors="replace").splitlines()
        text = " ".join(line.split("#", 1)[0] for line in lines).replace(",", " ")
        return _floats(text.split(), path)
    if spec.startswith("uniform:"):
        parts = spec.split(":")[1:]
        if len(parts) not in (3, 4):
            raise InputError(f"--p: expected uniform:N:LO:HI[:SEED], got {spec!r}")
        try:
            n, lo, hi, seed = int(parts[0]), float(parts[1]), float(parts[2]), int(parts[3] if len(parts) == 4 else 0)
        except ValueError:
            raise InputError(f"--p: expected uniform:N:LO:HI[:SEED] with numbers, got {spec!r}") from None
        if not 1 <= n <= MAX_WEIGHTS or not 0 < lo <= hi:
            raise InputError(f"--p: uniform needs 1 <= N <= {MAX_WEIGHTS} and 0 < LO <= HI, got {spec!r}")
        return rng.generator(seed, "pi_weights").uniform(lo, hi, size=n)
    return _floats(spec.split(","), "--p")


def _floats(items: list[str], where: str) -> np.ndarray:
    if len(items) > MAX_WEIGHTS:
        raise InputError(f"{where}: {len(items)} weights, at most {MAX_WEIGHTS}")
    try:
        p = np.array([float(x) for x in items], dtype=np.float64)
    except ValueError:
        raise InputError(f"{where}: expected numbers, got {items!r}"[:200]) from None
    if p.size == 0:
        raise InputError(f"{where}: no weights given")
    return p


def run_cli(args: argparse.Namespace) -> int:
    """``fedmpi pi``: print pi_R (table, or JSON with --json). Bad arguments raise InputError."""
    p = parse_weights(args.p, args.p_file)
    chain_shape(p.size, args.B, args.R, args.groups, CLI_KEYS)
    check_weights(p, p.size, CLI_KEYS["p"])
    if args.mc is not None:
        if args.mc < 1:
            raise InputError(f"--mc: ROUNDS must be >= 1, got {args.mc}")
        pi = stationary_mc(p, args.B, args.R, args.mc, args.seed, groups=args.groups)
    else:
        if args.max_states < 1:
            raise InputError(f"--max-states: must be >= 1, got {args.max_states}")
        try:
            pi = stationary_exact(p, args.B, args.R, max_states=args.max_states, groups=args.groups)
        except InputError as e:
            raise InputError(f"--exact: {str(e).removeprefix('max_states: ')}") from None
    l1 = l1_to_uniform(pi)
    if args.json:
        print(json.dumps({"pi": pi.tolist(), "l1_to_uniform": l1}))
        return 0
    how = f"Monte Carlo, {args.mc} rounds, seed {args.seed}" if args.mc is not None else "exact"
    shape = f"groups = {args.groups}" if args.groups is not None else f"B = {args.B}"
    print(f"pi_R for N = {p.size}, {shape}, R = {args.R} ({how})")
    print(f"{'client':>8} {'p_i':>10} {'pi_i':>12} {'N*pi_i':>8}")
    for i, (pi_i, p_i) in enumerate(zip(pi, p)):
        print(f"{i:>8} {p_i:>10.4g} {pi_i:>12.6g} {p.size * pi_i:>8.4f}")
    print(f"l1 distance to uniform: {l1:.6g}")
    return 0
