"""Per-client quantities of local training that an algorithm declares (``engine.quantities``):
their values against a direct computation on every training path, the same bits whatever the
block, the rank count (tests/test_examples.py: the Oort example under mpiexec) or a packed group,
and nothing changed for the rest (models, losses) when they are asked for."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from conftest import synthetic_config
from fedmpi import config
from fedmpi.algorithms import ServerAlgorithm, register
from fedmpi.build import build_components, build_task
from fedmpi.engine.local import LocalStats, LocalTrainer, Training
from fedmpi.engine.packed import PackedTrainer
from fedmpi.engine.quantities import MEAN_SQUARED_LOSS, ClientQuantity, SampleLosses
from fedmpi.models.losses import per_sample
from fedmpi.runtime import World

CPU = torch.device("cpu")
MAX_LOSS = ClientQuantity("max_loss", lambda s: np.where(s.taken[..., None], s.values, -np.inf).max((0, 2)))
FIRST_SQ = ClientQuantity("first_sq", lambda s: s.first(s.sample_mean(s.values ** 2)))
ASKED = (MEAN_SQUARED_LOSS, MAX_LOSS, FIRST_SQ)

# (model, trainer options): the closed form, the stacked layers' autograd, vmap(grad), the loop
PATHS = [("logreg", {}), ("mlp", {}), ("mlp", {"stacked": False}), ("mlp", {"path": "sequential"})]


def trainer(model: str, seed: int = 3, opts: dict | None = None, **over) -> LocalTrainer:
    cfg = config.from_dict(synthetic_config(seed=seed, task__model=model, task__hidden=8, **over))
    return LocalTrainer(build_task(cfg, CPU), cfg.train, cfg.seed, **{"path": "batched", **(opts or {})})


def start(tr: LocalTrainer, n: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    x0 = tr.spec.flatten(tr.task.model)
    return x0 + 0.1 * torch.randn(n, x0.numel(), generator=g)


def direct(tr: LocalTrainer, x0: torch.Tensor, ids: np.ndarray, t: int, steps: np.ndarray) -> np.ndarray:
    """(S, n, b) per-sample losses recomputed step by step: the model after s steps (training
    again for s steps: the same draws) on step s's minibatch; NaN after a client's last step."""
    each = per_sample(tr.task.loss)
    out = np.full((int(steps.max()), len(ids), tr.cfg.batch_size), np.nan)
    for s in range(int(steps.max())):
        x = tr.train(x0, ids, t, steps=np.minimum(steps, s)) if s else x0
        xb, yb, _ = tr.batch(ids, t, s)
        for j in np.flatnonzero(steps > s):
            o = torch.func.functional_call(tr.task.model, tr.spec.views(x[j]), (tr.task.inputs(xb[j]),))
            out[s, j] = each(o.unsqueeze(0), yb[j].unsqueeze(0))[0].double().numpy()
    return out


@pytest.mark.parametrize("model, opts", PATHS)
def test_the_quantities_are_what_they_say_on_every_path(model, opts):
    tr = trainer(model, train__local_steps=4, opts=opts)
    ids, steps = np.array([0, 3, 5, 7]), np.array([4, 1, 3, 2])
    x0 = start(tr, len(ids))
    stats = LocalStats(quantities=ASKED)
    tr.train(x0, ids, 2, steps=steps, stats=stats)
    each = direct(tr, x0, ids, 2, steps)
    want_sq = np.array([np.mean(each[:k, j] ** 2) for j, k in enumerate(steps)])
    assert np.allclose(stats.extra["sq_loss"], want_sq, rtol=1e-5)
    assert np.allclose(stats.extra["max_loss"], np.nanmax(each, axis=(0, 2)), rtol=1e-5)
    assert np.allclose(stats.extra["first_sq"], np.mean(each[0] ** 2, axis=1), rtol=1e-5)
    assert np.allclose(stats.loss, [np.mean(each[:k, j]) for j, k in enumerate(steps)], rtol=1e-5)


@pytest.mark.parametrize("model, opts", PATHS)
def test_asking_changes_no_other_bit_and_no_block_changes_them(model, opts):
    """Models and losses are the bits of a run that asks for nothing; each client's quantities are
    the same trained alone, in a block, or padded to a fixed shape."""
    tr = trainer(model, train__local_steps=3, train__local_steps_draw="uniform", opts=opts)
    ids = np.array([1, 2, 4, 6, 9])
    x0 = start(tr, len(ids))
    plain, asked = LocalStats(), LocalStats(quantities=ASKED)
    a = tr.train(x0, ids, 1, stats=plain)
    b = tr.train(x0, ids, 1, stats=asked)
    assert torch.equal(a, b) and np.array_equal(plain.loss, asked.loss)
    assert np.array_equal(plain.first_loss, asked.first_loss)
    for k in range(len(ids)):
        one = LocalStats(quantities=ASKED)
        tr.train(x0[k:k + 1], ids[k:k + 1], 1, stats=one)
        for q in ASKED:
            assert one.extra[q.name][0] == asked.extra[q.name][k], (q.name, k)
    if tr.path == "batched":
        tr.fixed_shape = True
        tr.chunk_size = lambda: 3  # blocks of 3 rows: the last one padded
        padded = LocalStats(quantities=ASKED)
        assert torch.equal(tr.train(x0, ids, 1, stats=padded), a)
        assert all(np.array_equal(padded.extra[q.name], asked.extra[q.name]) for q in ASKED)


def test_full_gradient_weights_each_sample_by_its_share():
    """``train.full_gradient``: every local sample each step, weighted 1 / n_i (padding 0)."""
    tr = trainer("logreg", train__full_gradient=True, train__local_steps=2)
    ids = np.array([0, 4])
    stats = LocalStats(quantities=(MEAN_SQUARED_LOSS,))
    x0 = start(tr, 2)
    tr.train(x0, ids, 0, stats=stats)
    task, each = tr.task, per_sample(tr.task.loss)
    x1 = tr.train(x0, ids, 0, steps=1)
    for j, i in enumerate(ids):
        rows = task.order[task.offsets[i]:task.offsets[i + 1]]
        xs, ys = task.train_x[rows], task.train_y[rows]
        sq = [each(torch.func.functional_call(task.model, tr.spec.views(x[j]), (task.inputs(xs),)).unsqueeze(0),
                   ys.unsqueeze(0))[0].double().pow(2).mean().item() for x in (x0, x1)]
        assert stats.extra["sq_loss"][j] == pytest.approx(np.mean(sq), rel=1e-5)


def test_a_packed_group_gives_each_run_its_own_quantities():
    """Runs of other seeds trained in one packed call, one asking for quantities beside one that
    asks for none and one that asks for none of the losses: each gets the bits it gets alone."""
    trainers = [trainer("mlp", seed=s, train__local_steps=3, train__local_steps_draw="uniform") for s in (0, 1, 2)]
    asks = [ASKED, (), None]
    ids = [np.array([0, 3, 4]), np.array([1, 2, 4, 8]), np.array([4, 0])]
    x0 = [start(tr, len(i)) for tr, i in zip(trainers, ids)]

    def jobs():
        return [Training(x, i, t=2, stats=None if a is None else LocalStats(quantities=a))
                for x, i, a in zip(x0, ids, asks)]

    alone = jobs()
    ends = [tr.run(job) for tr, job in zip(trainers, alone)]
    packed = PackedTrainer(trainers)
    packed.block_rows = lambda: 4  # blocks that straddle runs
    together = jobs()
    for a, b, ja, jb in zip(ends, packed.train(list(enumerate(together))), alone, together):
        assert torch.equal(a, b)
        if ja.stats is not None:
            assert np.array_equal(ja.stats.loss, jb.stats.loss)
            assert ja.stats.extra.keys() == jb.stats.extra.keys()
            assert all(np.array_equal(ja.stats.extra[k], jb.stats.extra[k]) for k in ja.stats.extra)
    assert set(together[0].stats.extra) == {"sq_loss", "max_loss", "first_sq"} and not together[1].stats.extra


def test_sample_losses_reductions():
    v = np.arange(12, dtype=np.float64).reshape(3, 2, 2)
    taken = np.array([[True, True], [True, False], [True, False]])
    s = SampleLosses(np.where(taken[..., None], v, 0.0), taken)
    assert s.step_mean(s.sample_mean(s.values)).tolist() == [np.mean(v[:, 0]), np.mean(v[0, 1])]
    assert s.first(s.sample_mean(s.values)).tolist() == [0.5, 2.5]
    assert s.rows(slice(1, 2)).values.shape == (3, 1, 2)
    w = SampleLosses(v, np.ones((3, 2), bool), np.array([[1.0, 0.0], [0.25, 0.75]]))
    assert w.sample_mean(v)[0].tolist() == [0.0, 0.25 * 2 + 0.75 * 3]


def test_an_algorithm_reads_them_in_its_outputs_and_a_bad_declaration_is_refused():
    @register("test_quantity_reader")
    class Reader(ServerAlgorithm):
        client_quantities = (MEAN_SQUARED_LOSS,)

        def weights(self, t, active, local):
            return np.full(len(local), 1.0 / self.cohort(active))

    cfg = config.from_dict({**synthetic_config(), "algorithm": {"name": "test_quantity_reader"}})
    algo = build_components(cfg, World()).algorithm
    assert algo.reads_outputs() and algo.outputs is None
    algo.round(0)
    out = algo.outputs
    assert len(out.ids) and np.isfinite(out.extra["sq_loss"]).all() and (out.extra["sq_loss"] > 0).all()
    assert (out.extra["sq_loss"] >= out.loss ** 2 * (1 - 1e-9)).all()  # E[l^2] >= E[l]^2 for each client
    from fedmpi.algorithms.base import Algorithm

    with pytest.raises(TypeError, match="only a ServerAlgorithm's round gathers them"):
        register("test_decentral_quantities")(type("D", (Algorithm,), {"client_quantities": (MEAN_SQUARED_LOSS,)}))
    for bad, why in (((MEAN_SQUARED_LOSS, MEAN_SQUARED_LOSS), "not a new identifier"),
                     (("sq_loss",), "is not a fedmpi.engine.quantities.ClientQuantity")):
        with pytest.raises(TypeError, match=why):
            register("test_bad_quantities")(type("Bad", (Reader,), {"client_quantities": bad}))


@register("test_quantity_store")
class _Stored(ServerAlgorithm):
    client_quantities = (dataclasses.replace(MEAN_SQUARED_LOSS, store=True), FIRST_SQ)  # one stored, one not

    def weights(self, t, active, local):
        return np.full(len(local), 1.0 / self.cohort(active))


def test_an_own_local_training_that_ignores_the_stats_leaves_them_nan():
    """A class with its own ``local_training`` that does not fill ``self.stats``: its clients'
    quantities are NaN (documented on ``ClientOutputs.extra``), not stale or missing."""

    class Own(_Stored):
        def local_training(self, t, local, start):
            return self.ctx.trainer.train(start, local, t)

    register("test_quantity_own_training")(Own)
    cfg = config.from_dict({**synthetic_config(), "algorithm": {"name": "test_quantity_own_training"}})
    algo = build_components(cfg, World()).algorithm
    algo.round(0)
    assert len(algo.outputs.ids) and np.isnan(algo.outputs.extra["sq_loss"]).all()
    assert np.isnan(algo.round_record()["client_rounds/sq_loss"]).all()


def test_a_stored_quantity_is_in_the_result_file_and_resumes_to_the_same_rows(tmp_path):
    """/client_rounds/sq_loss: one row per round, the trained clients' values (those the algorithm
    read), NaN for the others (the mask says who); a run failed at round 5 and resumed from its
    checkpoint of round 4 writes the same rows."""
    import h5py

    from fault_plugin import inject
    from fedmpi import results
    from fedmpi.runner import Runner

    cfg = config.from_dict(synthetic_config(rounds=7, algorithm={"name": "test_quantity_store"},
                                            runtime={"progress": False, "log_availability": True,
                                                     "checkpoint_every": 2}))
    seen = {}

    def keep(run, t):
        out = run.algorithm.outputs
        seen[t] = (out.ids.copy(), out.extra["sq_loss"].copy())

    straight, cut = str(tmp_path / "straight.h5"), str(tmp_path / "cut.h5")
    Runner(cfg, World(), straight, quiet=True, callbacks=[("round_end", keep)]).run()
    r = results.load(straight)
    rows, mask = r.records("client_rounds")["sq_loss"], r.mask()
    assert rows.shape == (7, 12) and np.array_equal(np.isfinite(rows), mask.astype(bool))
    for t, (ids, values) in seen.items():
        assert np.array_equal(rows[t, ids], values)
    assert set(r.records("client_rounds")) == {"sq_loss"}  # first_sq is not stored
    with pytest.raises(RuntimeError, match="injected"):
        Runner(cfg, World(), cut, quiet=True, callbacks=[inject("0:5:raise")]).run()
    Runner(cfg, World(), cut, quiet=True, resume=True).run()
    with h5py.File(straight) as a, h5py.File(cut) as b:
        assert np.array_equal(a["client_rounds/sq_loss"][:], b["client_rounds/sq_loss"][:], equal_nan=True)
        assert np.array_equal(a["final/params"][:], b["final/params"][:])
