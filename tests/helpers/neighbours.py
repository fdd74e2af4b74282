"""The neighbouring-run check of client-level DP, with the noise at 0 (docs/PRIVACY.md).

Round by round, from the same state, the round as the run plays it and the same round with one
client j added to (or taken from) the available set, or with other data (labels and sample
count): who is kept (the clock's deadline included) must be the same, the other clients'
contributions the same bits, and the part of the summed rows the noise protects
(``private_part``) may move by at most the sensitivity the algorithm declares for one client,
C * bound / divisor (twice that when j's data change: one update out, another in). An asynchronous
server's releases (``check_counted``): the schedule held, j's updates zeroed or on other data."""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from fedmpi.build import build_components
from fedmpi.participation import Participation
from fedmpi.privacy.declaration import declaration
from fedmpi.runtime import World


class Remembered:
    """``inner``'s available sets, drawn once per round (a stateful kind is asked once), with
    client ``toggle`` added or removed in round ``at``; anything else is ``inner``'s."""

    derived = ("drawn",)  # the sets drawn so far (a test's replay, never checkpointed)
    configuration = ("inner", "toggle", "at")

    def __init__(self, inner: Participation, drawn: dict[int, np.ndarray] | None = None, toggle: int = -1,
                 at: int = -1):
        self.inner, self.drawn, self.toggle, self.at = inner, {} if drawn is None else drawn, toggle, at

    def available(self, t: int) -> np.ndarray:
        if t not in self.drawn:
            self.drawn[t] = self.inner.available(t)
        ids = self.drawn[t]
        if t == self.at and self.toggle >= 0:  # (toggle -1: none; a union with it added a client -1)
            ids = np.setdiff1d(ids, [self.toggle]) if self.toggle in ids else np.union1d(ids, [self.toggle])
        return np.asarray(ids, dtype=np.int64)

    def __getattr__(self, name: str):  # what the kind says of itself (probabilities, sampling, ...)
        return getattr(self.inner, name)


def _spied(algo, zeroed: int = -1) -> dict:
    """Record each client's contribution row and the summed rows ``server_update`` receives;
    ``zeroed``: that client's update replaced by zeros (zero-out: its end model is its start)."""
    seen: dict = {"rows": {}, "total": None}
    contribution, server_update = algo.contribution, algo.server_update

    def rows(t, active, local, start, end):
        if zeroed in local:
            end = end.clone()
            end[local == zeroed] = start[local == zeroed]
        out = contribution(t, active, local, start, end)
        for i, row in zip(local.tolist(), out):
            seen["rows"][i] = row.clone()
        return out

    def update(t, active, total):
        seen["total"] = total.clone()
        return server_update(t, active, total)

    algo.contribution, algo.server_update = rows, update
    return seen


def _copy(state):
    for kind in ("shared", "clients", "union"):
        setattr(state, kind, {k: v.clone() for k, v in getattr(state, kind).items()})
    return state


def _changed(task, client: int):
    """``task`` with client ``client``'s data changed: its training labels, and its sample count
    halved (the count is data too: local epochs read it); the other clients' data kept."""
    lo, hi = int(task.offsets[client]), int(task.offsets[client + 1])
    rows = task.order[lo:hi]
    y = task.train_y.clone()
    y[rows] = (y[rows] + 1) % max(task.classes, 1) if task.classes else y[rows] + 1.0
    kept = max((hi - lo) // 2, 1)
    order = torch.cat([task.order[:lo + kept], task.order[hi:]])
    offsets = task.offsets.copy()
    offsets[client + 1:] -= hi - lo - kept
    hist = task.label_hist
    if hist is not None and task.classes:
        hist = hist.copy()
        hist[client] = np.bincount(y[order[lo:lo + kept]].long().cpu().numpy(), minlength=hist.shape[1])
    return dataclasses.replace(task, train_y=y, order=order, offsets=offsets, label_hist=hist)


def _spied_release(privacy, zeroed: int = -1) -> dict:
    """Record the updates an asynchronous server's clients send (after the bound) and each release
    with its contributors; ``zeroed``: that client's updates replaced by zeros (zero-out)."""
    seen: dict = {"rows": {}, "total": None, "contributors": None}
    client_side, server_side = privacy.client_side, privacy.server_side

    def clients(t, ids, start, end):
        if zeroed in ids:
            end = end.clone()
            end[np.flatnonzero(ids == zeroed)] = start[np.flatnonzero(ids == zeroed)]
        out = client_side(t, ids, start, end)
        for i, row in zip(ids.tolist(), out - start):
            seen["rows"][i] = row.clone()
        return out

    def server(t, total, *args, **kwargs):
        out = server_side(t, total, *args, **kwargs)
        seen["total"], seen["contributors"] = out.clone(), kwargs.get("contributors")
        return out

    privacy.client_side, privacy.server_side = clients, server
    return seen


def check_counted(cfg, rounds: int, client: int, change: str = "toggle") -> int:
    """The neighbouring-run check of an asynchronous server (counted releases, docs/PRIVACY.md "DP
    for asynchronous FL"), noise 0: step by step from the same state, ``client``'s updates zeroed
    (``"toggle"``: zero-out, the schedule being public) or trained on other data (``"data"``). The
    schedule (who contributes to the release) must be the same, every other client's update the same
    bits, and the released buffer may move by at most n C (2 n C for other data), n the client's
    updates in it. Returns how many steps the releases differed in."""
    world = World()
    run = build_components(cfg, world)
    algo = run.algorithm
    other_task = _changed(run.task, client) if change == "data" else run.task
    C = float(cfg.privacy.clip) * (2 if change == "data" else 1)
    differed = 0
    for t in range(rounds):
        before = _copy(algo.state_dict())
        other = build_components(cfg, world, task=other_task).algorithm
        other.load_state_dict(before)
        if change == "toggle":  # zero-out: the client's updates still in flight are zeros too
            flight = other.flight
            other.held[(flight.client == client) & (flight.trained == 1)] = 0
        mine = _spied_release(algo.privacy)
        theirs = _spied_release(other.privacy, zeroed=client if change == "toggle" else -1)
        algo.round(t), other.round(t)
        del algo.privacy.client_side, algo.privacy.server_side
        for i in set(mine["rows"]) & set(theirs["rows"]) - {client}:
            assert torch.equal(mine["rows"][i], theirs["rows"][i]), \
                f"step {t}: client {client} ({change}) changed client {i}'s update"
        if mine["total"] is None:
            assert theirs["total"] is None, f"step {t}: one run released, its neighbour did not"
            continue
        assert np.array_equal(mine["contributors"], theirs["contributors"]), \
            f"step {t}: client {client} ({change}) changed who the release holds"
        n = int(np.sum(np.asarray(mine["contributors"]) == client))
        moved = float((mine["total"] - theirs["total"]).norm())
        assert moved <= C * n * (1 + 1e-5) + 1e-9, \
            f"step {t}: client {client} ({change}, {n} updates) moved the release by {moved:.6g} > {C * n:.6g}"
        differed += moved > 0
    return differed


def check(cfg, rounds: int, client: int, change: str = "toggle", task=None,
          participation: Participation | None = None) -> int:
    """Play ``rounds`` rounds of ``cfg`` (privacy with noise_multiplier 0) on one rank and check every
    round against its neighbour: ``client`` toggled in the available set (``change="toggle"``), or
    with other training data (``"data"``: sensitivity twice one update's). An algorithm whose release
    does not hide participation (``Private(hides_participation=False)``, FedSWE) is private between
    zero-out neighbours only, the pattern being public: there ``"toggle"`` keeps the client in the
    available set and replaces its update by zeros. Returns how many rounds the neighbours' private
    sums differed in."""
    world = World()
    run = build_components(cfg, world, task=task, participation=participation)
    if run.privacy.ledger.counted:  # an asynchronous server: its releases follow the clock's public schedule
        return check_counted(cfg, rounds, client, change)
    memory = Remembered(run.participation)
    mechanism = run.privacy.mechanism  # distributed noise: one client moves the sum by its rounded vector
    inflation = mechanism.inflation(0.0, run.privacy.cohort) if hasattr(mechanism, "inflation") else 1.0
    algo = build_components(cfg, world, participation=memory, task=run.task).algorithm
    other_task = _changed(run.task, client) if change == "data" else run.task
    C = float(cfg.privacy.clip) * (2 if change == "data" else 1)
    zero_out = change == "toggle" and not declaration(type(algo), cfg.algorithm.name).hides_participation
    differed = 0
    for t in range(rounds):
        before = _copy(algo.state_dict())
        toggled = Remembered(run.participation, memory.drawn, client if change == "toggle" and not zero_out else -1, t)
        other = build_components(cfg, world, participation=toggled, task=other_task).algorithm
        other.load_state_dict(before)
        mine, theirs = _spied(algo), _spied(other, zeroed=client if zero_out else -1)
        algo.round(t), other.round(t)
        del algo.contribution, algo.server_update  # the class's own again
        kept, their_kept = (np.setdiff1d(a.active, [client] if change == "toggle" else []) for a in (algo, other))
        assert np.array_equal(kept, their_kept), \
            f"round {t}: client {client} ({change}) changed who is kept: {kept.tolist()} vs {their_kept.tolist()}"
        for i in set(mine["rows"]) & set(theirs["rows"]) - {client}:
            assert torch.equal(mine["rows"][i], theirs["rows"][i]), \
                f"round {t}: client {client} ({change}) changed client {i}'s contribution"
        a, bound, divisor = algo.private_part(t, mine["total"])
        b, _, _ = other.private_part(t, theirs["total"])
        moved = float((a - b).norm())
        allowed = C * bound / divisor * inflation
        assert moved <= allowed * (1 + 1e-5) + 1e-9, \
            f"round {t}: one client ({change}) moved the private sum by {moved:.6g} > its sensitivity {allowed:.6g}"
        differed += moved > 0
    return differed
