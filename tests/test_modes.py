"""Both server modes honour every hook an algorithm overrides, or refuse it at ``register`` with
one line naming the hook and the mode (#43 item 1): no hook is silently ignored."""

from __future__ import annotations

import copy

import h5py
import numpy as np
import pytest
from conftest import fedmpi, write_config
from fault_plugin import inject

from fedmpi import config
from fedmpi.algorithms import register
from fedmpi.algorithms.asynchronous import HONOURED
from fedmpi.algorithms.base import HOOKS, SWITCHES, ServerAlgorithm
from fedmpi.algorithms.fedavg import FedAvgActive
from fedmpi.algorithms.fedbuff import FedBuff
from fedmpi.algorithms.fedprox import Proximal
from fedmpi.build import build_components
from fedmpi.clock.flight import STREAMS, stream
from fedmpi.engine.quantities import MEAN_SQUARED_LOSS
from fedmpi.errors import InputError
from fedmpi.runner import Runner
from fedmpi.runtime import World

OVERRIDES = {"select": lambda self, t, available: available[:1],
             "failures": lambda self, t, failed, late: None,
             "start_models": lambda self, local: self.x.expand(len(local), -1),
             "lr_scale": lambda self, t, local: None,
             "local_terms": lambda self, t, local, start: (),
             "local_training": lambda self, t, local, start: start,
             "contribution": lambda self, t, active, local, start, end: end - start,
             "weights": lambda self, t, active, local: np.ones(len(local)),
             "private_part": lambda self, t, total: (total, 1.0, 1.0),
             "server_update": lambda self, t, active, total: self.x.double(),
             "after_round": lambda self, t, active, local, start, end: None,
             "client_outputs": True, "delta_norms": True, "client_quantities": (MEAN_SQUARED_LOSS,)}


def test_the_tables_name_every_overridable_hook():
    """Every name in HOOKS / SWITCHES is a member of ServerAlgorithm (a renamed hook fails here)."""
    assert set(OVERRIDES) == set(HOOKS) | set(SWITCHES)
    assert all(hasattr(ServerAlgorithm, h) for h in OVERRIDES)


@pytest.mark.parametrize("hook", sorted(set(OVERRIDES) - set(HONOURED)))
def test_an_async_plugin_overriding_an_ignored_hook_is_refused_at_register(hook):
    cls = type("Mine", (FedBuff,), {hook: OVERRIDES[hook], "__module__": __name__})
    with pytest.raises(TypeError) as e:
        register(f"async_with_{hook}")(cls)
    line = str(e.value)
    assert "\n" not in line and f"Mine.{hook}" in line and "asynchronous" in line, line


@pytest.mark.parametrize("hook", sorted(set(OVERRIDES)))
def test_the_synchronous_round_honours_every_hook(hook):
    cls = type("Mine", (FedAvgActive,), {hook: OVERRIDES[hook], "__module__": __name__})
    assert cls._unhonoured() is None


def test_client_state_is_refused_in_the_asynchronous_mode():
    cls = type("Mine", (FedBuff,), {"client_state": ("rows",), "__module__": __name__})
    with pytest.raises(TypeError, match=r"Mine.client_state: the asynchronous server"):
        register("async_with_client_state")(cls)


def test_clients_anywhere_beside_client_state_is_refused_not_ignored():
    cls = type("Mine", (FedAvgActive,), {"client_state": ("rows",), "__module__": __name__})  # inherits anywhere
    with pytest.raises(TypeError, match=r"Mine.clients_anywhere: the synchronous round ignores it beside "
                                        r"client_state"):
        register("anywhere_with_client_state")(cls)
    ok = type("Mine", (FedAvgActive,), {"client_state": ("rows",), "clients_anywhere": False, "__module__": __name__})
    assert ok._unhonoured() is None


# ----------------------------------------------------------------------------- the asynchronous hooks

U, LR = [0.0, 30.0, 100.0], 0.1


class AsyncProx(FedBuff):
    """Asynchronous FedProx: FedBuff whose clients minimise F_i(y) + (mu/2)||y - x_t||^2 (a plug-in:
    the term is the synchronous FedProx's)."""

    def local_terms(self, t, local, start):
        return (Proximal(0.5, start),)


register("test_async_prox")(AsyncProx)


def quadratic_run(path, algorithm, rounds=12) -> h5py.File:
    """3 clients F_i(y) = (y - u_i)^2 / 2, 2 local steps of lr 0.1, lognormal speeds: tasks in flight
    across server steps (staleness > 0)."""
    cfg = {"seed": 3, "rounds": rounds, "eval_every": 1,
           "task": {"dataset": "quadratic", "model": "scalar", "clients": len(U), "u": U, "x0": 0.0},
           "train": {"local_steps": 2, "batch_size": 1, "lr": LR}, "algorithm": algorithm,
           "clock": {"kind": "lognormal", "step_time": 1.0, "comm_time": 1.0, "sigma": 1.0},
           "runtime": {"progress": False}}
    Runner(config.from_dict(copy.deepcopy(cfg)), World(), str(path), quiet=True).run()
    return h5py.File(path)


def local_model(x: float, u: float, mu: float) -> float:
    """Two SGD steps on (y - u)^2 / 2 + (mu/2)(y - x)^2 from y = x."""
    y = x
    for _ in range(2):
        y -= LR * ((y - u) + mu * (y - x))
    return y


def test_async_fedprox_matches_a_hand_replay(tmp_path):
    """local_terms is honoured by the asynchronous server: each kept arrival is the proximal local
    model from the version it was dispatched at; x^{t+1} = x^t + mean of the step's kept Delta_i."""
    f = quadratic_run(tmp_path / "p.h5", {"name": "test_async_prox", "concurrency": 2, "buffer": 2,
                                          "staleness": "none"})
    x, ev = f["metrics/x"][:].astype(np.float64), {k: f["events"][k][:] for k in f["events"]}
    assert (ev["staleness"] > 0).any()
    replay = [0.0]
    for t in range(len(x) - 1):
        here = ev["round"] == t + 1
        tasks = zip(ev["client"][here], ev["version"][here])
        deltas = [local_model(replay[v], U[c], 0.5) - replay[v] for c, v in tasks]
        replay.append(replay[t] + sum(deltas) / 2)
    assert np.allclose(x, replay, atol=1e-4), (x, replay)
    plain = quadratic_run(tmp_path / "b.h5", {"name": "fedbuff", "concurrency": 2, "buffer": 2, "staleness": "none"})
    assert not np.allclose(plain["metrics/x"][:], x, atol=1e-3)  # the term changed the result


def test_fedasync_rho_matches_a_hand_replay(tmp_path):
    """FedAsync's proximal local objective (Xie et al.): x_i = 2 steps on F_i(y) + (rho/2)||y - x_v||^2
    from x_v, then x <- (1 - a s(tau)) x + a s(tau) x_i, s(tau) = (1 + tau)^-0.5."""
    algorithm = {"name": "fedasync", "concurrency": 2, "alpha": 0.6, "staleness": "poly", "rho": 2.0}
    f = quadratic_run(tmp_path / "a.h5", algorithm)
    x, ev = f["metrics/x"][:].astype(np.float64), {k: f["events"][k][:] for k in f["events"]}
    assert (ev["staleness"] > 0).any() and (ev["outcome"] == 0).all()
    replay = [0.0]
    for t, (c, v, tau) in enumerate(zip(ev["client"], ev["version"], ev["staleness"])):
        a = 0.6 * (1 + tau) ** -0.5
        replay.append((1 - a) * replay[t] + a * local_model(replay[v], U[c], 2.0))
    assert np.allclose(x, replay, atol=1e-4), (x, replay)



def test_fedasync_without_rho_keeps_the_digest_its_checkpoints_were_written_with():
    """A FedAsync checkpoint written before algorithm.rho resumes (the digest main computed before rho)."""
    cfg = {"seed": 2, "rounds": 8, "task": {"dataset": "synthetic", "clients": 8, "model": "logreg"},
           "algorithm": {"name": "fedasync", "concurrency": 3}, "clock": {"kind": "constant"}}
    assert config.from_dict(copy.deepcopy(cfg)).resume_digest() == "4d7e7062c8f41d1c"
    cfg["algorithm"]["rho"] = 0.1
    assert config.from_dict(cfg).resume_digest() != "4d7e7062c8f41d1c"


# ----------------------------------------------------------------------------- a task's random streams

AGAIN = {"seed": 2, "rounds": 8, "eval_every": 2,
         "task": {"dataset": "synthetic", "clients": 3, "model": "logreg",
                  "synthetic": {"samples": 60, "test_samples": 20, "features": 3, "classes": 2}},
         "train": {"local_steps": 2, "batch_size": 2, "lr": 0.1},
         "algorithm": {"name": "fedbuff", "concurrency": 3, "buffer": 5, "staleness": "none",
                       "once_per_version": False},
         "clock": {"kind": "lognormal", "step_time": 1.0, "comm_time": 1.0, "sigma": 1.0, "dropout": 0.1},
         "runtime": {"progress": False, "checkpoint_every": 1}}


def test_a_task_stream_is_its_version_for_a_first_task_else_its_own():
    assert stream(0, 7, 0) == 7
    again = {stream(0, 7, k) for k in (1, 2, 3)} | {stream(0, 8, 1), stream(1, 7, 1)}
    assert len(again) == 5 and min(again) >= STREAMS


def test_a_client_trains_again_before_the_model_moves_on_its_own_streams(tmp_path):
    """once_per_version false: K = 5 arrivals from 3 clients per step, so clients train twice from
    one version; each such task draws other minibatches (its stream), and the run resumes exactly."""
    f = h5py.File(_run(AGAIN, tmp_path / "a.h5"))
    ev = {k: f["events"][k][:] for k in f["events"]}
    pairs = list(zip(ev["client"], ev["version"]))
    assert len(set(pairs)) < len(pairs)  # a client trained twice from one version
    run = build_components(config.from_dict(copy.deepcopy(AGAIN)), World())
    start = run.algorithm.x.expand(1, -1)
    first, second = (run.trainer.train(start, np.array([1]), 0, steps=2, stream=stream(2, 0, k)) for k in (0, 1))
    assert not np.array_equal(first.numpy(), second.numpy())
    with pytest.raises(RuntimeError, match="injected"):
        _run(AGAIN, tmp_path / "b.h5", callbacks=[inject("0:5:raise")])
    b = h5py.File(_run(AGAIN, tmp_path / "b.h5", resume=True))
    assert np.array_equal(f["final/params"][:], b["final/params"][:])
    assert all(np.array_equal(f["events"][k][:], b["events"][k][:]) for k in f["events"])


def test_once_per_version_keeps_the_rule_and_its_refusal():
    cfg = copy.deepcopy(AGAIN)
    cfg["algorithm"]["once_per_version"] = True
    with pytest.raises(InputError, match=r"algorithm.buffer: 5 arrivals per step, more than task.clients"):
        config.from_dict(cfg)


def _run(cfg: dict, path, **kw) -> str:
    Runner(config.from_dict(copy.deepcopy(cfg)), World(), str(path), quiet=True, **kw).run()
    return str(path)


@pytest.mark.slow
@pytest.mark.mpi
def test_repeated_tasks_give_the_same_bits_on_1_2_and_3_ranks(tmp_path):
    """Repeat levels train in calls of their own on each rank's share: still the same bits."""
    cfg = write_config(tmp_path / "c.yaml", dict(AGAIN, runtime={"progress": False}))
    outs = {}
    for ranks in (0, 2, 3):
        outs[ranks] = str(tmp_path / f"r{ranks}.h5")
        fedmpi(["run", cfg, "--out", outs[ranks], "--quiet"], ranks=ranks)
    with h5py.File(outs[0]) as one:
        for ranks in (2, 3):
            with h5py.File(outs[ranks]) as other:
                assert np.array_equal(one["final/params"][:], other["final/params"][:]), ranks
