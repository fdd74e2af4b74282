"""Split training samples over m clients (``task.partition``).

Every kind first assigns an owner client to each sample (vectorised over samples and
classes, never a Python loop over clients), then a deterministic repair gives every empty
client one sample from the largest client of its pool, so that each client can draw
minibatches. Kinds:

- ``iid``: a random permutation cut into m near-equal parts.
- ``dirichlet``: client i draws nu_i ~ Dirichlet(alpha) over the classes; the samples of
  class c are shuffled and cut among the clients in proportion to nu_i[c] (FedSWE paper):
  every sample goes to exactly one client, client sizes differ.
- ``shards``: client i holds ``classes_per_client`` distinct classes (consecutive slots of
  a seeded class permutation, so classes are used as evenly as possible); each class is cut
  evenly among its holders and no sample is shared (DSpodFL paper: m = 10, 1 class each ->
  one whole class per client). With m * classes_per_client < classes some classes go unused.
- ``groups``: clients form ``groups`` contiguous blocks (client i in group floor(i G / m));
  classes form G contiguous blocks likewise; each group splits its classes' samples by
  ``dirichlet`` among its clients (FedSWE Sec. 7.1: 2 groups x 5 classes).
- ``natural``: the dataset's own client ids (``DataArrays.client_train``, e.g. LEAF's users):
  client i holds the samples of the i-th smallest id (``natural_parts``); ids beyond the first
  m are left out. Regression datasets (no labels) take ``iid`` or ``natural``.

Local test splits (``task.partition.local_test``): a fraction of each client's samples held out
of training (``split_local_test``), or, for ``natural``, the test samples with the client's id
(``DataArrays.client_test``, ``natural_test_parts``).
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING

import numpy as np

from ..errors import InputError

if TYPE_CHECKING:
    from .datasets import PartitionConfig


def partition(labels: np.ndarray, m: int, cfg: PartitionConfig, gen: np.random.Generator) -> list[np.ndarray]:
    """For each of the m clients, the sorted int64 indices of its training samples."""
    labels = np.asarray(labels, dtype=np.int64)
    n = labels.size
    if m > n:
        raise InputError(f"task.partition: cannot give each of {m} clients (task.clients) a sample: "
                         f"only {n} training samples")
    classes = int(labels.max()) + 1 if n else 0
    clients = np.arange(m)
    if cfg.kind == "iid":
        owner = np.empty(n, dtype=np.int64)
        owner[gen.permutation(n)] = np.repeat(clients, _even_sizes(n, m))
        pools = [clients]
    elif cfg.kind == "dirichlet":
        owner = _dirichlet(labels, np.arange(classes), clients, cfg.alpha, gen, np.full(n, -1, np.int64))
        pools = [clients]
    elif cfg.kind == "shards":
        owner = _shards(labels, classes, m, cfg.classes_per_client, gen)
        pools = [clients]
    elif cfg.kind == "groups":
        g = cfg.groups
        if g > m or g > classes:
            raise InputError(f"task.partition.groups: {g} groups need at least {g} clients and {g} classes "
                             f"(have {m} clients, {classes} classes)")
        group_of_client = client_groups(m, cfg)
        group_of_class = (np.arange(classes) * g) // classes
        owner = np.full(n, -1, np.int64)
        pools = [np.flatnonzero(group_of_client == k) for k in range(g)]
        for k, pool in enumerate(pools):
            _dirichlet(labels, np.flatnonzero(group_of_class == k), pool, cfg.alpha, gen, owner)
    else:
        raise InputError(f"task.partition.kind: unknown kind {cfg.kind!r} (allowed: iid, dirichlet, shards, groups)")
    _fill_empty(owner, pools, m, cfg.kind)
    return _split(owner, m)


def natural_parts(ids: np.ndarray, m: int) -> list[np.ndarray]:
    """For each of the first m distinct client ids (ascending), the sorted indices of its samples."""
    ids = np.asarray(ids, dtype=np.int64)
    distinct, owner = np.unique(ids, return_inverse=True)
    if m > distinct.size:
        raise InputError(f"task.clients: {m} clients, but the dataset's natural partition has only "
                         f"{distinct.size} client ids")
    return _split(np.where(owner < m, owner, -1), m)


def natural_test_parts(train_ids: np.ndarray, test_ids: np.ndarray, m: int) -> list[np.ndarray]:
    """For each client i of ``natural_parts(train_ids, m)``, the sorted indices of the test
    samples with its id; a test sample whose id is not one of those m clients' is in none."""
    distinct = np.unique(np.asarray(train_ids, dtype=np.int64))[:m]
    test_ids = np.asarray(test_ids, dtype=np.int64)
    pos = np.searchsorted(distinct, test_ids)
    found = (pos < distinct.size) & (distinct[np.minimum(pos, distinct.size - 1)] == test_ids)
    return _split(np.where(found, pos, -1), m)


def split_local_test(parts: list[np.ndarray], fraction: float,
                     gen: np.random.Generator) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """(train, local test) parts: each client holds out floor(fraction n_i) of its samples, drawn
    by ``gen``, at least one when n_i >= 2 and never its last one (``task.partition.local_test``)."""
    train, test = [], []
    for p in parts:
        k = min(max(int(fraction * p.size), 1 if fraction > 0 else 0), p.size - 1)
        held = np.zeros(p.size, dtype=bool)
        held[gen.choice(p.size, size=max(k, 0), replace=False)] = True
        train.append(p[~held])
        test.append(p[held])
    return train, test


def label_histogram(labels: np.ndarray, parts: list[np.ndarray], classes: int) -> np.ndarray:
    """(m, classes) int64: how many samples of each class every client holds."""
    labels = np.asarray(labels, dtype=np.int64)
    hist = np.zeros((len(parts), classes), dtype=np.int64)
    if parts:
        sizes = np.array([len(p) for p in parts])
        flat = np.concatenate(parts).astype(np.int64)
        np.add.at(hist, (np.repeat(np.arange(len(parts)), sizes), labels[flat]), 1)
    return hist


def client_groups(m: int, cfg: PartitionConfig) -> np.ndarray | None:
    """(m,) group id of each client for kind ``groups`` (floor(i G / m)), else None."""
    if cfg.kind != "groups":
        return None
    return (np.arange(m, dtype=np.int64) * cfg.groups) // m


# ----------------------------------------------------------------------------- kinds

def _even_sizes(n: int, parts: int) -> np.ndarray:
    """``parts`` sizes summing to n that differ by at most one (larger first)."""
    return n // parts + (np.arange(parts) < n % parts)


def _dirichlet(labels: np.ndarray, classes: np.ndarray, clients: np.ndarray, alpha: float,
               gen: np.random.Generator, owner: np.ndarray) -> np.ndarray:
    """Cut the samples of ``classes`` among ``clients`` by per-client Dirichlet(alpha) vectors;
    writes into and returns ``owner``."""
    if classes.size == 0:
        return owner
    nu = gen.dirichlet(np.full(classes.size, alpha), size=clients.size)  # (clients, classes)
    for j, c in enumerate(classes):
        idx = gen.permutation(np.flatnonzero(labels == c))
        w = nu[:, j]
        total = w.sum()
        share = w / total if np.isfinite(total) and total > 0 else np.full(w.size, 1.0 / w.size)
        bounds = np.round(np.cumsum(share) * idx.size).astype(np.int64)
        bounds[-1] = idx.size
        owner[idx] = np.repeat(clients, np.diff(bounds, prepend=0))
    return owner


def _shards(labels: np.ndarray, classes: int, m: int, k: int, gen: np.random.Generator) -> np.ndarray:
    if k > classes:
        raise InputError(f"task.partition.classes_per_client: {k} classes per client but the data has "
                         f"only {classes} classes")
    perm = gen.permutation(classes)
    held = perm[(np.arange(m)[:, None] * k + np.arange(k)) % classes]  # (m, k) distinct per row
    owner = np.full(labels.size, -1, np.int64)
    holders_flat, classes_flat = np.repeat(np.arange(m), k), held.ravel()
    for c in range(classes):
        holders = holders_flat[classes_flat == c]
        if holders.size == 0:
            continue  # m * k < classes: this class is not used
        idx = gen.permutation(np.flatnonzero(labels == c))
        owner[idx] = np.repeat(holders, _even_sizes(idx.size, holders.size))
    return owner


# ----------------------------------------------------------------------------- repair and split

def _fill_empty(owner: np.ndarray, pools: list[np.ndarray], m: int, kind: str) -> None:
    """Give every empty client one sample (the highest index) of the largest client of its pool
    (the first such client in pool order), in increasing order of the empty clients. A heap of
    the donors' sizes keeps this O((m + n) log m) when most clients start empty."""
    counts = np.bincount(owner[owner >= 0], minlength=m)
    if counts.all():
        return
    by_owner = np.argsort(owner, kind="stable")  # unowned (-1) first, then each client's samples ascending
    end = np.count_nonzero(owner < 0) + np.cumsum(counts)  # one past each client's last sample
    for pool in pools:
        empty = pool[counts[pool] == 0]
        if empty.size == 0:
            continue
        heap = [(-int(counts[c]), k, int(c)) for k, c in enumerate(pool) if counts[c] > 0]
        heapq.heapify(heap)
        for i in empty:
            if not heap or -heap[0][0] < 2:
                raise InputError(f"task.partition: kind {kind!r} leaves client {i} without samples and no "
                                 f"client of its pool has a sample to spare (fewer samples than clients)")
            _, k, donor = heapq.heappop(heap)
            end[donor] -= 1
            owner[by_owner[end[donor]]] = i  # the donor's highest sample index still its own
            counts[donor] -= 1
            counts[i] += 1
            heapq.heappush(heap, (-int(counts[donor]), k, donor))


def _split(owner: np.ndarray, m: int) -> list[np.ndarray]:
    order = np.argsort(owner, kind="stable")  # ascending sample index within each client
    sizes = np.bincount(owner[owner >= 0], minlength=m)
    order = order[np.count_nonzero(owner < 0):]  # unused samples (owner -1) sort first
    return [a.astype(np.int64) for a in np.split(order, np.cumsum(sizes)[:-1])]
