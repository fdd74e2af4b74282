"""Secure aggregation as the sum of a release (``aggregation: {kind: secagg}``, #45 item 1;
fedmpi/privacy/aggregation.py, docs/PRIVACY.md "Secure aggregation"): the server's decoded sum is
exactly the plain sum of the survivors' quantized rows, with dropouts; a round without enough
shares aborts, logged and recorded; bytes, shares and stages per client in the result file; what
does not make sense is refused in one line; 1 == 2 ranks and resume, bit for bit."""

from __future__ import annotations

import copy
import logging

import h5py
import numpy as np
import pytest
import torch
from conftest import assert_resume_identical, fedmpi, synthetic_config, write_config

from fedmpi import config, rng
from fedmpi.build import build_components
from fedmpi.errors import InputError
from fedmpi.privacy import secagg as S
from fedmpi.privacy.aggregation import DONE, MASKED, SHARED, AggregationParams, SecureAggregation, plan
from fedmpi.runner import Runner
from fedmpi.runtime import World

SECAGG = {"kind": "secagg", "bits": 16, "clip_range": 0.5, "neighbours": 4, "threshold": 2, "dropout": 0.2,
          "unmask_dropout": 0.1}


def run_config(**over) -> dict:
    cfg = synthetic_config(algorithm={"name": "fedavg_active"}, aggregation=dict(SECAGG))
    cfg["availability"] = {"kind": "stationary", "base": {"kind": "fixed", "values": 0.7}}
    for k, v in over.items():
        section, _, key = k.partition("__")
        if key:
            cfg[section][key] = v
        else:
            cfg[section] = v
    return cfg


def quantized(seed: int, t: int, u: int, row: np.ndarray, scale: float, bits: int, modulus: int) -> np.ndarray:
    """Client u's quantized row in round t, signed: stochastic rounding keyed (seed, secagg_round, t, u)."""
    uniforms = rng.uniform(rng.key(seed, "secagg_round", t, u), np.arange(row.shape[0]))
    return S.signed(S.quantize(row.copy(), scale, bits, uniforms, modulus)[0], modulus)


# ----------------------------------------------------------------------------- the server's sum

def test_the_servers_sum_is_exactly_the_plain_sum_of_the_survivors_quantized_rows():
    """Over rounds with dropouts at both stages: the decoded sum == sum over U2 of the signed
    quantized rows / scale, bit for bit."""
    params = AggregationParams(kind="secagg", bits=12, modulus_bits=32, neighbours=6, threshold=2, dropout=0.2,
                               unmask_dropout=0.1)
    stage = SecureAggregation(params, 3, World(), 30)
    seen = {"dropped": 0, "quiet": 0, "aborted": 0, "whole": 0}
    for t in range(12):
        active = np.sort(rng.generator(t, "cohort").choice(30, 14, replace=False))
        rows = torch.from_numpy(rng.generator(t, "rows").normal(0, 0.4, (14, 40)))
        total = stage.sum(t, active, active, lambda s, rows=rows: rows[s].clone(), 1.0)
        p = plan(params, 3, t, active)
        scale = S.levels(12) / 1.0
        expected = np.zeros(40, np.int64)
        for j, u in enumerate(active.tolist()):
            if u in p.survivors:
                expected += quantized(3, t, u, rows[j].numpy(), scale, 12, 2**32)
        if p.aborted:
            seen["aborted"] += 1
            assert not total.any()
            continue
        assert torch.equal(total, torch.from_numpy(expected / scale)), t
        rec = stage.record()
        assert rec["aggregation/survivors"] == len(p.survivors) and rec["aggregation/clamped"] > 0
        reached = rec["aggregation/reached"]
        assert np.isnan(reached[np.setdiff1d(np.arange(30), active)]).all()
        seen["dropped"] += int(np.sum(reached == SHARED))
        seen["quiet"] += int(np.sum(reached == MASKED))
        seen["whole"] += 1
    assert seen["dropped"] and seen["quiet"] and seen["whole"] >= 6  # the test exercised dropouts at both stages


@pytest.mark.parametrize("bits", [8, 16, 32])
def test_masked_sum_of_any_integer_vectors_is_their_sum_mod_the_modulus(bits):
    """The integer-lattice interface (a distributed mechanism's noisy integers): any int64 vectors in
    [0, 2^bits) come back summed mod 2^bits over the survivors, with dropouts at both stages."""
    params = AggregationParams(kind="secagg", neighbours=4, threshold=2, dropout=0.15, unmask_dropout=0.1)
    stage = SecureAggregation(params, 8, World(), 20)
    whole = 0
    for t in range(8):
        active = np.sort(rng.generator(t, "c").choice(20, 11, replace=False))
        z = rng.integers(rng.key(t, "z"), np.arange(11 * 17), 2**bits).astype(np.int64).reshape(11, 17)
        got = stage.masked_sum(t, active, active, lambda s, z=z: z[s], 17, 2**bits)
        p = plan(params, 8, t, active)
        if p.aborted:
            assert got is None
            continue
        keep = np.array([u in p.survivors for u in active.tolist()])
        assert np.array_equal(got, z[keep].sum(0) % 2**bits), t
        whole += 1
    assert whole >= 4


def test_the_plan_aborts_exactly_when_a_needed_seed_lacks_threshold_shares():
    params = AggregationParams(kind="secagg", neighbours=2, threshold=2, dropout=0.3)
    for t in range(40):
        ids = np.arange(10)
        p = plan(params, 1, t, ids)
        short = [u for u in ids.tolist() if (u in p.survivors or any(int(v) in p.survivors for v in p.graph[u]))
                 and sum(int(v) in p.alive for v in p.graph[u]) < 2]
        assert bool(p.aborted) == (bool(short) or len(p.alive) < 2), t
    assert plan(params, 1, 0, np.array([4])).aborted  # one client: no neighbour holds its shares
    assert not plan(params, 1, 0, np.zeros(0, np.int64)).aborted  # nobody: an empty round, not an abort


def test_under_dp_a_quantized_row_stays_within_the_rows_bound():
    """With ``norm`` (privacy: C bound / divisor) each row keeps room for the rounding, so a client's
    decoded row is within the bound: the decoded sum's sensitivity is the mechanism's."""
    params = AggregationParams(kind="secagg", bits=8, neighbours=2, threshold=1)
    stage = SecureAggregation(params, 1, World(), 4)
    norm, d = 0.05, 30
    assert 0 < 1 - np.sqrt(d) / S.levels(8) < 1
    for t in range(30):
        rows = torch.zeros(2, d, dtype=torch.float64)
        rows[0] = torch.from_numpy(rng.generator(t, "r").normal(0, 1, d))
        rows[0] *= norm / rows[0].norm() * (1 + t % 3)  # at the bound, or above it (as if unclipped)
        total = stage.sum(t, np.array([0, 3]), np.array([0, 3]), lambda s, rows=rows: rows[s].clone(), norm, norm)
        assert 0 < float(total.norm()) <= norm, t


def test_too_few_bits_for_the_models_coordinates_are_refused_under_dp():
    data = run_config(aggregation={"kind": "secagg", "bits": 4},
                      privacy={"mechanism": "gaussian", "clip": 0.2, "noise_multiplier": 0.5})
    with pytest.raises(InputError, match=r"aggregation.bits: rounding 68 coordinates to 2\^3 - 1 levels"):
        build_components(config.from_dict(data), World())


# ----------------------------------------------------------------------------- runs

def test_an_aborted_round_is_logged_recorded_and_moves_nothing(caplog):
    cfg = config.from_dict(run_config(aggregation={**SECAGG, "dropout": 0.3}, rounds=12))
    algo = build_components(cfg, World()).algorithm
    aborted = 0
    logger = logging.getLogger("fedmpi.privacy.aggregation")  # fedmpi's loggers may not propagate to caplog's
    logger.addHandler(caplog.handler)
    with caplog.at_level(logging.INFO, logger="fedmpi.privacy.aggregation"):
        for t in range(cfg.rounds):
            before = algo.x.clone()
            algo.round(t)
            if algo.round_record()["aggregation/aborted"]:
                aborted += 1
                assert torch.equal(before, algo.x)
                assert f"round {t}: secure aggregation aborted" in caplog.text
            else:
                assert not torch.equal(before, algo.x)
    logger.removeHandler(caplog.handler)
    assert 0 < aborted < cfg.rounds


def test_a_run_records_each_clients_bytes_shares_and_stage_per_round(tmp_path):
    path = str(tmp_path / "r.h5")
    cfg = config.from_dict(run_config())
    Runner(cfg, World(), path, quiet=True).run()
    dim = 16 * 4 + 4
    with h5py.File(path) as f:
        g = {k: f["aggregation"][k][:] for k in f["aggregation"]}
        mask_n = f["metrics/n_active"][:]
    assert g["reached"].shape == (cfg.rounds, 12)
    inside = ~np.isnan(g["reached"])
    assert set(np.unique(g["reached"][inside])) <= {SHARED, MASKED, DONE} and (g["reached"] == SHARED).any()
    for k in ("sent_bytes", "received_bytes", "shares"):
        assert np.array_equal(np.isnan(g[k]), ~inside), k
    masked = g["reached"] >= MASKED
    assert np.all(g["sent_bytes"][masked] > dim * 4) and np.all(g["sent_bytes"][g["reached"] == SHARED] < dim * 4)
    done = (g["reached"] == DONE) & (g["aborted"][:, None] == 0)
    assert np.all(g["shares"][done] >= 2) and np.all(g["shares"][~done & inside] == 0)
    assert np.all(g["survivors"][g["aborted"] == 0] == masked[g["aborted"] == 0].sum(1))
    assert len(mask_n) >= 1


def test_secure_aggregation_without_noise_trains_like_the_plain_sum(tmp_path):
    """Without dropouts and with 24 bits the decoded sum is the plain sum to 1/scale a coordinate."""
    data = run_config(aggregation={"kind": "secagg", "bits": 24, "clip_range": 1.0})
    plain = copy.deepcopy(data)
    del plain["aggregation"]
    Runner(config.from_dict(data), World(), str(tmp_path / "s.h5"), quiet=True).run()
    Runner(config.from_dict(plain), World(), str(tmp_path / "p.h5"), quiet=True).run()
    with h5py.File(tmp_path / "s.h5") as a, h5py.File(tmp_path / "p.h5") as b:
        x, y = a["final/params"][:], b["final/params"][:]
        assert not np.array_equal(x, y) and np.allclose(x, y, atol=1e-4)
        assert a["metrics/test_loss"][-1] < a["metrics/test_loss"][0]


def test_under_dp_the_default_range_is_the_clipped_rows_bound_and_nothing_is_clamped():
    data = run_config(aggregation={"kind": "secagg", "bits": 16},
                      privacy={"mechanism": "gaussian", "clip": 0.2, "noise_multiplier": 0.5})
    algo = build_components(config.from_dict(data), World()).algorithm
    for t in range(4):
        algo.round(t)
        rec = algo.round_record()
        assert rec["aggregation/clamped"] == 0 and rec["privacy/noise_multiplier"] == 0.5


@pytest.mark.parametrize("mechanism", ["distributed_dgauss", "distributed_skellam"])
def test_distributed_noise_under_secure_aggregation_is_the_same_release(mechanism, tmp_path):
    """A distributed mechanism's integers masked and unmasked by secure aggregation: the server gets
    the same Z mod 2^bits as the plain modular sum, so the run is the same bits; the protocol's record
    is there."""
    data = run_config(privacy={"mechanism": mechanism, "clip": 0.2, "noise_multiplier": 0.7, "bits": 14},
                      availability={"kind": "cohort", "size": 5}, aggregation={"kind": "secagg"})
    plain = copy.deepcopy(data)
    del plain["aggregation"]
    Runner(config.from_dict(data), World(), str(tmp_path / "s.h5"), quiet=True).run()
    Runner(config.from_dict(plain), World(), str(tmp_path / "p.h5"), quiet=True).run()
    with h5py.File(tmp_path / "s.h5") as a, h5py.File(tmp_path / "p.h5") as b:
        assert np.array_equal(a["final/params"][:], b["final/params"][:])
        assert np.array_equal(a["metrics/epsilon"][:], b["metrics/epsilon"][:])
        assert np.all(a["aggregation/survivors"][:] == 5) and not a["aggregation/aborted"][:].any()
        assert np.all(np.nansum(a["aggregation/shares"][:], 1) > 0)
        assert not np.array_equal(a["metrics/test_loss"][0], a["metrics/test_loss"][-1])


@pytest.mark.parametrize("over, says", [
    ({"algorithm": {"name": "scaffold"}}, "aggregation.kind: secagg: algorithm.name scaffold keeps per-client state"),
    ({"algorithm": {"name": "mifa"}}, "algorithm.name mifa keeps per-client state"),
    ({"algorithm": {"name": "power_of_choice", "select": 2, "candidates": 3}},
     "algorithm.name power_of_choice reads each client's own numbers"),
    ({"algorithm": {"name": "fedexp"}}, "algorithm.name fedexp reads each client's own numbers"),
    ({"algorithm": {"name": "fedbuff", "concurrency": 3, "buffer": 2}, "clock": {"kind": "constant"},
      "availability": {"kind": "always"}}, "algorithm.name fedbuff runs its own server step"),
    ({"algorithm": {"name": "dgd"}, "topology": {"kind": "ring"}, "availability": {"kind": "always"}},
     "algorithm.name dgd has no server"),
    ({"privacy": {"mechanism": "local_gaussian", "clip": 0.2, "noise_multiplier": 0.5}},
     "privacy.mechanism: local_gaussian's noise"),
    ({"privacy": {"mechanism": "gaussian", "clip": 0.2, "noise_multiplier": 0.5, "target_quantile": 0.5}},
     "privacy.target_quantile: adaptive clipping"),
    ({"aggregation": {"kind": "secagg"}}, "aggregation.clip_range: give the range"),
    ({"aggregation": {**SECAGG, "bits": 32}}, "aggregation.bits: 12 clients x (2^31 - 1) can pass M/2"),
    ({"aggregation": {**SECAGG, "modulus_bits": 48, "bits": 8}, "task__clients": 20000},
     "aggregation.modulus_bits: a sum of 20000 masked integers"),
    ({"aggregation": {**SECAGG, "neighbours": 3}}, "aggregation.neighbours: the ring of SecAgg+"),
    ({"aggregation": {**SECAGG, "threshold": 5}}, "aggregation.threshold: 5 shares of a seed held by 4"),
    ({"aggregation": {"kind": "plain", "bits": 12}}, "aggregation.bits: only read with aggregation.kind: secagg"),
    ({"privacy": {"mechanism": "distributed_dgauss", "clip": 0.2, "noise_multiplier": 0.5},
      "aggregation": {"kind": "secagg", "modulus_bits": 40}},
     "aggregation.modulus_bits: under privacy.mechanism distributed_dgauss secure aggregation masks the mechanism's"),
    ({"privacy": {"mechanism": "gaussian", "clip": 0.2, "noise_multiplier": 0.5}},
     "aggregation.clip_range: under privacy.mechanism the range is privacy.clip's"),
    ({"privacy": {"mechanism": "gaussian", "clip": 0.2, "noise_multiplier": 0.5},
      "aggregation": {**SECAGG, "clip_range": None}},
     "aggregation.dropout: under privacy.mechanism a dropout can abort"),
])
def test_what_secure_aggregation_cannot_do_is_refused_in_one_line(over, says):
    data = run_config(**{k: v for k, v in over.items() if not k.startswith("task__")})
    if "task__clients" in over:
        data["task"]["clients"] = over["task__clients"]
    with pytest.raises(InputError) as e:
        config.from_dict(data)
    assert says in str(e.value) and "\n" not in str(e.value)


# ----------------------------------------------------------------------------- bits

@pytest.mark.slow
def test_secure_aggregation_resumes_bit_identically(tmp_path):
    cfg = config.from_dict(run_config(privacy={"mechanism": "gaussian", "clip": 0.2, "noise_multiplier": 0.5},
                                      aggregation={"kind": "secagg", "neighbours": 4, "threshold": 2}))
    cfg.runtime.checkpoint_every = 2
    assert_resume_identical(cfg, tmp_path, fail_at=3)


@pytest.mark.slow
@pytest.mark.mpi
def test_one_and_two_ranks_are_bit_identical(tmp_path):
    data = run_config(train={"local_steps": 3, "batch_size": 8, "lr": 0.1, "engine": "sequential"},
                      aggregation={**SECAGG, "clip_range": 0.01})  # some coordinates clamped, counted over ranks
    fedmpi(["run", write_config(tmp_path / "c.yaml", data), "--quiet", "--out", str(tmp_path / "two.h5")], ranks=2)
    Runner(config.from_dict(data), World(), str(tmp_path / "one.h5"), quiet=True).run()
    with h5py.File(tmp_path / "one.h5") as a, h5py.File(tmp_path / "two.h5") as b:
        assert b.attrs["world_size"] == 2
        assert np.array_equal(a["final/params"][:], b["final/params"][:])
        assert np.array_equal(a["metrics/test_loss"][:], b["metrics/test_loss"][:])
        for k in a["aggregation"]:
            assert np.array_equal(a["aggregation"][k][:], b["aggregation"][k][:], equal_nan=True), k
        assert (a["aggregation/reached"][:] == SHARED).any() and a["aggregation/clamped"][:].sum() > 0
