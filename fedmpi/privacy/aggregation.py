"""The ``aggregation`` section: how the server gets the sum of the clients' rows, plain or by secure
aggregation emulated with its arithmetic (``kind: secagg``; the arithmetic is ``secagg``'s, this
module runs one round of it over the ranks; docs/PRIVACY.md, "Secure aggregation").

One round (``SecureAggregation.sum``; every rank, collective as the sum is):

1. the plan (``plan``, every rank, the same bits: nothing is communicated): the cohort A_t, its
   neighbour graph, who drops where (keyed by (seed, round, client)), whether the round aborts;
2. each rank's clients in the cohort quantize their rows (range ``clip_range``, ``bits``) and mask
   them (``secagg.mask``; ``masked_sum`` masks any integer vectors mod a power of two: a distributed
   mechanism's noisy integers too); a client dropped at the masking stage sends nothing (a zero row);
3. the masked rows go through the reproducible sum (``engine.reduce``: integers < 2^modulus_bits,
   a sum of at most 2^(51 - modulus_bits) of them is exact in float64);
4. rank 0 reconstructs the seeds it needs from the shares of clients still alive, removes the
   masks and decodes: its sum is exactly sum_{u in U2} q_u / scale (``secagg.decode``).

An aborted round (fewer than the threshold of shares for a seed the server needs, or fewer than
the threshold of clients alive) releases an empty sum, as a round without clients; it is logged and
recorded (``aggregation/aborted``). Per round, the result file gets (``record``) each client's bytes
sent and received, the shares it sent the server and the stage it reached, NaN outside the cohort.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, fields
from typing import Any, Callable, Literal, Optional

import numpy as np
import torch

from .. import rng
from ..engine.reduce import reproducible_sum_blocks
from ..errors import InputError
from ..runtime import World
from ..schema import Digest, opt
from . import secagg

log = logging.getLogger(__name__)

#: the stage a client of the cohort reached (``aggregation/reached``): its keys shared, its masked
#: input in the sum, its shares sent at unmasking
SHARED, MASKED, DONE = 2, 3, 4


@dataclass
class AggregationParams:
    """The ``aggregation`` block (docs/CONFIG.md); ``kind: plain`` is the reproducible float sum."""

    kind: Literal["plain", "secagg"] = opt(
        "plain", "how the server gets the sum of the clients' rows: plain (a reproducible float sum) or secagg "
                 "(secure aggregation emulated with its arithmetic: rows quantized, masked, summed mod "
                 "2^modulus_bits, unmasked from Shamir shares; docs/PRIVACY.md)",
        digest=Digest(off="plain"))  # a plain sum: the checkpoints before the section
    bits: int = opt(16, "secagg: a client's coordinate is an integer in [-(2^(bits-1) - 1), 2^(bits-1) - 1] over "
                        "[-clip_range, clip_range] (stochastic rounding)", ge=2, le=40)
    modulus_bits: int = opt(32, "secagg: the sum is taken mod M = 2^modulus_bits (Flower's SecAgg+: 2^32)",
                            ge=8, le=48)
    clip_range: Optional[float] = opt(
        None, "secagg: each coordinate of a client's row is clamped to [-clip_range, clip_range] before "
              "quantizing; null = privacy.clip x the release's weight bound (no clipped update is clamped; "
              "needs privacy.clip)", gt=0)
    neighbours: Optional[int] = opt(
        None, "secagg: each client's neighbours k (SecAgg+: a ring of the shuffled cohort, k/2 each side; "
              "every other client when k >= n - 1), even; null = 2 ceil(log2 n)", ge=2)
    threshold: Optional[int] = opt(None, "secagg: Shamir shares that reconstruct a client's seed (t of its k "
                                         "neighbours); null = floor(k/2) + 1", ge=1)
    dropout: float = opt(0.0, "secagg: probability that a client drops after masking, before its masked input "
                              "arrives (the server removes its masks from its neighbours' shares)", ge=0, lt=1)
    unmask_dropout: float = opt(0.0, "secagg: probability that a client whose masked input arrived drops before "
                                     "sending its shares (its input stays in the sum)", ge=0, lt=1)

    @property
    def on(self) -> bool:
        return self.kind == "secagg"

    @property
    def modulus(self) -> int:
        return 2 ** self.modulus_bits


def check(cfg: Any) -> None:
    """Cross-key checks of the ``aggregation`` section (InputError naming the keys)."""
    a = cfg.aggregation
    if not a.on:
        given = next((f.name for f in fields(AggregationParams) if f.name != "kind"
                      and getattr(a, f.name) != f.default), None)
        if given is not None:
            raise InputError(f"aggregation.{given}: only read with aggregation.kind: secagg (got kind {a.kind!r})")
        return
    why = refusal(cfg)
    if why is not None:
        raise InputError(why)
    m = cfg.task.clients
    lattice = distributed(cfg)
    if not lattice and secagg.wraps(m, a.bits, a.modulus):
        raise InputError(f"aggregation.bits: {m} clients x (2^{a.bits - 1} - 1) can pass M/2 = 2^{a.modulus_bits - 1},"
                         f" a modular wrap of the sum (lower aggregation.bits or raise aggregation.modulus_bits)")
    key, bits = ("privacy.bits", cfg.privacy.bits) if lattice else ("aggregation.modulus_bits", a.modulus_bits)
    if bits + math.ceil(math.log2(max(m, 1))) + 1 > 52:
        raise InputError(f"{key}: a sum of {m} masked integers < 2^{bits} is not exact in float64 (the reproducible "
                         f"sum): {key} + log2(task.clients) must stay under 51")
    if a.neighbours is not None and a.neighbours % 2:
        raise InputError(f"aggregation.neighbours: the ring of SecAgg+ gives each client k/2 neighbours on each "
                         f"side, so k must be even (got {a.neighbours})")
    if a.threshold is not None and a.neighbours is not None and a.threshold > a.neighbours:
        raise InputError(f"aggregation.threshold: {a.threshold} shares of a seed held by {a.neighbours} neighbours "
                         f"could never be gathered (at most aggregation.neighbours)")


def refusal(cfg: Any) -> str | None:
    """Why ``cfg`` cannot run under secure aggregation (one line naming the keys), or None."""
    from ..registry import ALGORITHMS

    a, p, name = cfg.aggregation, cfg.privacy, cfg.algorithm.name
    why = algorithm_refusal(ALGORITHMS.get(name).obj)
    if why is not None:
        return f"aggregation.kind: secagg: algorithm.name {name} {why}"
    if distributed(cfg) and getattr(p, "band", 1) > 1:
        return (f"privacy.band: {p.mechanism} with b = {p.band} re-sends earlier rounds' rows, which "
                f"aggregation.kind secagg does not mask yet (set privacy.band: 1 or aggregation.kind: plain)")
    if distributed(cfg):
        key = next((k for k in ("bits", "modulus_bits") if getattr(a, k) != AggregationParams.__dataclass_fields__[
            k].default), None)
        if key is not None:
            return (f"aggregation.{key}: under privacy.mechanism {p.mechanism} secure aggregation masks the "
                    f"mechanism's integers mod 2^privacy.bits (leave aggregation.{key} at its default)")
    if p.mechanism == "local_gaussian":
        return ("privacy.mechanism: local_gaussian's noise (sigma C on each coordinate) would be clamped at "
                "aggregation.clip_range; under aggregation.kind secagg use a central mechanism or distributed noise")
    if p.mechanism != "none" and p.target_quantile is not None:
        return ("privacy.target_quantile: adaptive clipping sums the clients' unclipped bits outside the secure "
                "aggregation (aggregation.kind: secagg); give a fixed privacy.clip")
    if p.mechanism != "none" and p.clip is not None:
        if a.clip_range is not None:
            return ("aggregation.clip_range: under privacy.mechanism the range is privacy.clip's bound on a client's "
                    "row, which keeps the decoded sum's sensitivity the mechanism's (leave it null)")
        key = next((k for k in ("dropout", "unmask_dropout") if getattr(a, k) > 0), None)
        if key is not None:
            return (f"aggregation.{key}: under privacy.mechanism a dropout can abort a round depending on who took "
                    f"part (the neighbours holding the shares), an event the accountant does not cover")
    if a.clip_range is None and (p.mechanism == "none" or p.clip is None):
        return ("aggregation.clip_range: give the range of a client's row coordinates (no privacy.clip bounds "
                "them)")
    return None


def distributed(cfg: Any) -> bool:
    """Whether ``cfg``'s mechanism puts the clients' rows on its own integer lattice (noise_at
    "distributed": its integers mod 2^privacy.bits are what secure aggregation masks)."""
    from ..registry import MECHANISMS

    p = cfg.privacy
    return p.mechanism != "none" and MECHANISMS.get(p.mechanism).obj.noise_at == "distributed"


def participation_decides_aborts(params: AggregationParams | None, sampling: Any) -> bool:
    """Whether one client's taking part can decide whether a round of secure aggregation aborts: a
    cohort too small aborts (a lone client always: no neighbour holds its shares), so under Poisson
    sampling, where a client's presence changes the cohort's size, it can. Then the releases of two
    add-or-remove neighbours differ by the other clients' rows too, which amplification by sampling
    does not cover (the accountant then charges every participation, ``Privacy``). With a cohort of
    fixed size, or a schedule taken as public (no amplification: zero-out neighbours), an abort is the
    same in both runs and releases no row: its round costs nothing, and charging its participants,
    as the accountant does, is conservative."""
    return params is not None and params.on and getattr(sampling, "kind", "none") == "poisson"


def algorithm_refusal(cls: type) -> str | None:
    """Why the algorithm class ``cls`` cannot sum under secure aggregation (a phrase), or None. Read
    from where its hooks are defined (no import of the algorithms, a higher layer): a server's round
    sums in ``finish_round``, which the class that defines ``round`` must define too."""
    from ..state import declared

    if definer(cls, "finish_round") is None:
        return "has no server whose sum the masks could hide"
    if definer(cls, "round") is not definer(cls, "finish_round"):
        return "runs its own server step (secure aggregation masks a cohort's rows together)"
    if declared(cls, "client_state"):
        return (f"keeps per-client state ({', '.join(declared(cls, 'client_state'))}) that assumes the server got "
                f"each client's row, which a dropout or an aborted round does not give")
    if any(getattr(cls, k, False) for k in ("client_outputs", "delta_norms", "client_quantities")):
        return "reads each client's own numbers (losses, steps or norms), where the server may see only the sum"
    return None


def definer(cls: type, hook: str) -> type | None:
    """The class in ``cls``'s MRO that defines ``hook`` (None: none does)."""
    return next((c for c in cls.__mro__ if hook in vars(c)), None)


# ----------------------------------------------------------------------------- one round's plan
@dataclass
class Plan:
    """One round of the protocol as every rank sees it (the same bits everywhere)."""

    cohort: np.ndarray  # A_t, sorted
    graph: dict[int, np.ndarray]  # u -> N(u)
    threshold: int  # t
    reached: dict[int, int]  # u -> SHARED, MASKED or DONE
    aborted: str = ""  # why the round aborted ("" when it did not)

    @property
    def survivors(self) -> set[int]:
        """U2: the clients whose masked input is in the sum."""
        return {u for u, s in self.reached.items() if s >= MASKED}

    @property
    def alive(self) -> set[int]:
        """U3: the clients that send their shares at unmasking."""
        return {u for u, s in self.reached.items() if s == DONE}


def plan(params: AggregationParams, seed: int, t: int, cohort: np.ndarray) -> Plan:
    """Round t's protocol for ``cohort``: its graph, its dropouts (keyed by (seed, t, client)) and
    whether the server can unmask: every seed it needs (b_u of a survivor, sk_v of a dropped client
    with a surviving neighbour) has ``threshold`` shares among the alive neighbours."""
    ids = np.sort(np.asarray(cohort, dtype=np.int64))
    n = len(ids)
    k = min(n - 1, params.neighbours) if params.neighbours is not None else secagg.default_degree(n)
    k = max(k, 0)
    thr = params.threshold if params.threshold is not None else k // 2 + 1
    graph = secagg.neighbour_graph(ids, k, rng.key(seed, "secagg_graph", t))
    lost = rng.uniform(rng.key(seed, "secagg_dropout", t), ids) < params.dropout
    quiet = rng.uniform(rng.key(seed, "secagg_unmask_dropout", t), ids) < params.unmask_dropout
    reached = {int(u): SHARED if lo else MASKED if qu else DONE for u, lo, qu in zip(ids, lost, quiet)}
    out = Plan(ids, graph, thr, reached)
    if n == 0:
        return out
    alive = out.alive
    if len(alive) < thr:
        out.aborted = f"{len(alive)} of {n} clients alive at unmasking, fewer than aggregation.threshold {thr}"
        return out
    for u in (int(u) for u in ids):
        needed = u in out.survivors or any(int(v) in out.survivors for v in graph[u])
        held = sum(int(v) in alive for v in graph[u])
        if needed and held < thr:
            what = "self-mask seed" if u in out.survivors else "key (it dropped)"
            out.aborted = f"client {u}'s {what} has {held} of {thr} shares among its {len(graph[u])} neighbours"
            return out
    return out


def traffic(p: Plan, u: int, dim: int, modulus_bits: int) -> tuple[int, int, int]:
    """(bytes sent, bytes received, shares sent at unmasking) by client u in the plan's round: its
    two public keys and its neighbours', an encrypted pair of shares per neighbour each way, its
    masked input (dim x modulus_bits / 8 bytes), the list of who survived and a share per
    neighbour at unmasking (``secagg.ELEMENT_BYTES`` a field element, ``ID_BYTES`` an id)."""
    E, ID = secagg.ELEMENT_BYTES, secagg.ID_BYTES
    k, stage = len(p.graph[u]), p.reached[u]
    sent, received = 2 * E + k * (2 * E + 2 * ID), k * 2 * E + k * (2 * E + 2 * ID)
    if stage >= MASKED:
        sent += dim * math.ceil(modulus_bits / 8)
    shares = k if stage == DONE and not p.aborted else 0
    if stage == DONE:
        received += k * ID
        sent += shares * (E + ID)
    return sent, received, shares


def cohort_of(world: World, clients: np.ndarray) -> np.ndarray:
    """The round's cohort, sorted, from every rank's ``clients`` (collective: an allgather)."""
    return np.sort(np.concatenate([np.asarray(c, dtype=np.int64) for c in world.allgather_obj(clients)]))


def margin(dim: int, bits: int) -> float:
    """1 - sqrt(dim) / L: the share of a row's norm bound left to the row when its quantized row must
    stay within the bound (each of its dim coordinates rounded by less than 1 / scale = r / L, r the
    range, here the bound itself); <= 0 when ``bits`` are too few for ``dim`` coordinates."""
    return 1.0 - math.sqrt(dim) / secagg.levels(bits)


# ----------------------------------------------------------------------------- the stage
class SecureAggregation:
    """Secure aggregation of a run (``aggregation.kind: secagg``): ``sum`` in place of the plain
    reproducible sum (every rank, collective), ``record`` of the last round (rank 0 reads it)."""

    #: the per-round datasets it records: per client (m columns, NaN outside the cohort), then numbers
    CLIENT_SERIES = ("sent_bytes", "received_bytes", "shares", "reached")
    SERIES = ("aborted", "survivors", "clamped")

    def __init__(self, params: AggregationParams, seed: int, world: World, m: int):
        self.params, self.seed, self.world, self.m = params, seed, world, m
        self._last: dict[str, Any] = self.empty_record()

    def sum(self, t: int, active: np.ndarray, local: np.ndarray, make_rows: Callable[[slice], torch.Tensor],
            clip_range: float, norm: float | None = None) -> torch.Tensor:
        """The sum of the cohort's rows as the server decodes it (rank 0; zeros elsewhere), from
        ``make_rows(slice)`` of the rank's ``local`` clients (pure, as ``reproducible_sum_blocks``
        wants), each coordinate clamped to ``clip_range``, quantized and masked (``masked_sum``).
        Collective. ``norm`` (under privacy: the bound C bound / divisor of a row, = ``clip_range``):
        each row is first scaled to norm at most (1 - sqrt(d) / L) norm, so that its quantized row, off
        by less than 1 / scale a coordinate, stays within ``norm`` (``margin``): the sum's sensitivity
        is the mechanism's."""
        a = self.params
        width = make_rows(slice(0, 0)).shape[-1]
        device = self.world.device
        scale = secagg.levels(a.bits) / clip_range
        clamped: dict[int, int] = {}  # per client: a block's rows may be made twice

        def quantized(s: slice) -> np.ndarray:
            rows = make_rows(s).detach().double().cpu().numpy()
            if norm is not None:  # room for the rounding: ||q_u / scale|| <= ||x_u|| + sqrt(d) / scale <= norm
                room = norm * margin(width, a.bits)
                lengths = np.linalg.norm(rows, axis=1)
                rows = rows * np.minimum(1.0, room / np.maximum(lengths, 1e-300))[:, None]
            out = np.zeros(rows.shape, dtype=np.int64)
            for j, u in enumerate(int(u) for u in local[s]):
                uniforms = rng.uniform(rng.key(self.seed, "secagg_round", t, u), np.arange(width))
                out[j], clamped[u] = secagg.quantize(rows[j], scale, a.bits, uniforms, a.modulus)
            return out

        s = self.masked_sum(t, active, local, quantized, width, a.modulus, private=norm is not None)
        if s is None:
            return torch.zeros(width, dtype=torch.float64, device=device)
        count = torch.tensor([float(sum(clamped.values()))], dtype=torch.float64, device=device)
        count = self.world.sum_to_server_(count)  # collective: every rank
        if not self.world.is_server:
            return torch.zeros(width, dtype=torch.float64, device=device)
        self._last["aggregation/clamped"] = float(count.item())
        return torch.from_numpy(secagg.decode(s, a.modulus, scale)).to(device)

    def masked_sum(self, t: int, active: np.ndarray, local: np.ndarray, ints: Callable[[slice], np.ndarray],
                   width: int, modulus: int, private: bool = False) -> np.ndarray | None:
        """sum_{u in U2} z_u mod ``modulus`` as the server unmasks it (rank 0; zeros elsewhere), from
        ``ints(slice)``: the rank's ``local`` clients' integer vectors z_u, int64 (n, width) in
        [0, modulus) (the integer-lattice interface: quantized rows, or a distributed mechanism's noisy
        integers); None on every rank when the round aborts (logged). Collective: the masked inputs go
        through the reproducible sum (exact: integers < modulus, modulus x 2n <= 2^53)."""
        p = plan(self.params, self.seed, t, active)
        self._remember(p, width, modulus)
        if p.aborted:
            if self.world.is_server:
                log.info("round %d: secure aggregation aborted (%s); the round's sum is empty%s", t, p.aborted,
                         " (no client's row is released; the accountant still charges the round's participants:"
                         " conservative, docs/PRIVACY.md)" if private else "")
            return None
        device = self.world.device

        def masked(s: slice) -> torch.Tensor:
            z = ints(s)
            out = np.zeros(z.shape, dtype=np.float64)
            for j, u in enumerate(int(u) for u in local[s]):
                if u in p.survivors:  # a client dropped at masking: its input never arrives
                    out[j] = self.masked_input(t, p, u, z[j], modulus)
            return torch.from_numpy(out).to(device)

        total = reproducible_sum_blocks(self.world, masked, len(local), len(active), overwrite=True)
        if not self.world.is_server:
            return np.zeros(width, dtype=np.int64)
        return self.unmask(t, p, total.cpu().numpy().astype(np.int64), modulus)

    # ---------------------------------------------------------------- the clients' messages
    def masked_input(self, t: int, p: Plan, u: int, z: np.ndarray, modulus: int) -> np.ndarray:
        """Client u's y_u from its integer vector z (its keys and its neighbours' public keys)."""
        sk, b = secagg.client_secrets(self.seed, t, u)
        keys = {int(v): secagg.public_key(secagg.client_secrets(self.seed, t, int(v))[0]) for v in p.graph[u]}
        return secagg.mask(z, u, sk, b, keys, modulus)

    def shares(self, t: int, p: Plan, owner: int, which: str) -> dict[int, int]:
        """The shares of ``owner``'s seed (``which``: "sk" or "b") that its first t alive neighbours
        send the server at unmasking (each evaluated from the owner's polynomial, dealt at ShareKeys)."""
        sk, b = secagg.client_secrets(self.seed, t, owner)
        holders = [int(v) for v in p.graph[owner] if int(v) in p.alive][: p.threshold]
        key = rng.key(self.seed, f"secagg_share_{which}", t, owner)
        return secagg.share(sk if which == "sk" else b, np.asarray(holders), p.threshold, key)

    # ---------------------------------------------------------------- the server
    def unmask(self, t: int, p: Plan, Y: np.ndarray, modulus: int) -> np.ndarray:
        """sum_{u in U2} z_u mod M from the summed masked inputs (rank 0): the seeds reconstructed
        from the shares, the masks removed."""
        survivors = p.survivors
        self_seeds = {u: secagg.reconstruct(self.shares(t, p, u, "b")) for u in sorted(survivors)}
        dropped = {int(v): secagg.reconstruct(self.shares(t, p, int(v), "sk")) for v in p.cohort
                   if int(v) not in survivors and any(int(w) in survivors for w in p.graph[int(v)])}
        public = {u: secagg.public_key(secagg.client_secrets(self.seed, t, u)[0]) for u in survivors}
        return secagg.unmask(Y, self_seeds, dropped, p.graph, public, survivors, modulus)

    # ---------------------------------------------------------------- the record
    def empty_record(self) -> dict[str, Any]:
        row = {f"aggregation/{k}": np.full(self.m, np.nan) for k in self.CLIENT_SERIES}
        return {**row, **{f"aggregation/{k}": 0.0 for k in self.SERIES}}

    def _remember(self, p: Plan, dim: int, modulus: int) -> None:
        rec = self.empty_record()
        for u in (int(u) for u in p.cohort):
            sent, received, shares = traffic(p, u, dim, modulus.bit_length() - 1)
            for k, v in zip(self.CLIENT_SERIES, (sent, received, shares, p.reached[u])):
                rec[f"aggregation/{k}"][u] = v
        rec["aggregation/aborted"] = float(bool(p.aborted))
        rec["aggregation/survivors"] = 0.0 if p.aborted else float(len(p.survivors))
        self._last = rec

    def record(self) -> dict[str, Any]:
        """The last round's record (every rank; ``clamped`` only on rank 0): per client (m, NaN
        outside the cohort) ``aggregation/sent_bytes``, ``received_bytes``, ``shares`` (sent the
        server at unmasking), ``reached`` (2: keys shared, dropped before its masked input; 3: input
        in, dropped before unmasking; 4: done); ``aborted`` (1: the round's sum was empty),
        ``survivors`` (|U2| summed) and ``clamped`` (coordinates clamped to the range)."""
        return dict(self._last)
