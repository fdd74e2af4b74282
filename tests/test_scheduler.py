"""The scheduler (``fedmpi.clock.scheduler``): the server's one component of time, its policies and
their declared state (#43 item 1)."""

from __future__ import annotations

import copy
import os

import numpy as np
import torch
import yaml
from conftest import ROOT, synthetic_config

from fedmpi import config
from fedmpi.build import build_components
from fedmpi.clock.scheduler import Rounds, Steps, TimedRounds
from fedmpi.runtime import World

STORED = os.path.join(ROOT, "tests", "data")


def built(data: dict):
    return build_components(config.from_dict(copy.deepcopy(data)), World()).algorithm


def test_the_untimed_policy_keeps_every_selected_client_in_no_time():
    """Without ``clock:`` the server asks the untimed policy: round t's available set, everyone
    selected kept, no time, no events, no state."""
    algo = built(synthetic_config())
    sched = algo.clock
    assert type(sched) is Rounds
    available = sched.available(0)
    assert np.array_equal(available, built(synthetic_config()).ctx.participation.available(0))
    selected = available[::2]
    cohort = sched.keep(0, selected)
    assert cohort.kept is selected and not len(cohort.failed) and not len(cohort.late) and cohort.duration == 0.0
    assert sched.virtual_time() is None and sched.round_events() is None
    assert not sched.state_dict().shared
    algo.round(0)
    assert algo.virtual_time() is None and algo.round_events() is None


def _saved_keys(case: str) -> set[str]:
    """The algorithm's shared keys in a stored checkpoint (written by an earlier main)."""
    folder = os.path.join(STORED, case, "interrupted.h5.ckpt")
    shard = next(os.path.join(r, f) for r, _, fs in os.walk(folder) for f in fs if f.endswith(".pt"))
    saved = torch.load(shard, map_location="cpu", weights_only=True)
    return {k.removeprefix("algorithm/shared/") for k in saved if k.startswith("algorithm/shared/")}


def test_each_policy_saves_its_state_under_the_keys_stored_checkpoints_hold():
    """The scheduler names its own keys; they are those the clock and the tasks in flight had in
    checkpoints written before it existed (a synchronous run with a deadline, FedBuff), so those
    still load."""
    for case, policy in (("resume_main/clock", TimedRounds), ("resume_f400d91/fedbuff", Steps)):
        with open(os.path.join(STORED, case, "config.yaml")) as f:
            algo = built(yaml.safe_load(f))
        assert type(algo.clock) is policy
        own = set(algo.clock.state_dict().shared)
        assert own and own <= _saved_keys(case), case
        assert set(algo.state_dict().shared) == _saved_keys(case), case


def test_the_asynchronous_policy_resumes_the_same_schedule():
    """``Steps``' state restored into a fresh run gives the next server step the same arrivals,
    the same tasks to train and the same virtual time; with availability in time too."""
    base = synthetic_config(rounds=4, algorithm={"name": "fedbuff", "concurrency": 4, "buffer": 3},
                            clock={"kind": "lognormal", "step_time": 1.0, "comm_time": 2.0, "sigma": 0.8,
                                   "dropout": 0.15, "slot": 5.0})
    for data in (dict(base, availability={"kind": "always"}, clock=dict(base["clock"], slot=None)), base):
        algo = built(data)
        for t in range(2):
            algo.round(t)
        again = built(data)
        again.load_state_dict(algo.state_dict())
        assert again.virtual_time() == algo.virtual_time()
        a, b = algo.clock.arrivals(2, 3, None), again.clock.arrivals(2, 3, None)
        assert a.kept == b.kept and a.fresh == b.fresh and np.array_equal(a.in_flight, b.in_flight)
        assert algo.virtual_time() == again.virtual_time() > 0
