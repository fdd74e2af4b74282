"""Capabilities declared once per algorithm (#43 item 3, ``fedmpi.algorithms.capabilities``): what it
trains, what state it keeps where, which hooks it overrides, what it reads from other sections;
contradicting declarations are refused at ``register``; ``packs`` is derived; and every built-in and
example algorithm, run on a config that records what it reads, reads no key of another section it
did not declare."""

from __future__ import annotations

import dataclasses
import os

import pytest
import torch
from conftest import ROOT
from helpers import combinations as C

from fedmpi import config, plugins
from fedmpi.algorithms import ServerAlgorithm, register
from fedmpi.algorithms.capabilities import capabilities, reads_within
from fedmpi.algorithms.fedavg import FedAvgActive
from fedmpi.build import build_components
from fedmpi.errors import InputError
from fedmpi.registry import ALGORITHMS
from fedmpi.runtime import World


class Recorder:
    """A view of a config block that records the dotted key of every value read through it."""

    def __init__(self, block, path: str, seen: set[str]):
        self._block, self._path, self._seen = block, path, seen

    def __getattr__(self, name: str):
        value = getattr(self._block, name)
        key = f"{self._path}.{name}" if self._path else name
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return Recorder(value, key, self._seen)
        if not callable(value):
            self._seen.add(key)
        return value


def ours() -> list[str]:
    plugins.load([os.path.join(ROOT, "examples", "fedmpi_examples")])
    return [e.name for e in ALGORITHMS if e.name in ALGORITHMS.names(builtin_only=True)
            or "fedmpi_examples" in e.obj.__module__]


def read_keys(cfg: config.Config) -> set[str]:
    """The keys an algorithm reads through its config in set-up and two rounds."""
    run = build_components(cfg, World())
    seen: set[str] = set()
    fields = {f.name: getattr(run, f.name) for f in dataclasses.fields(run) if f.name in
              ("world", "task", "trainer", "participation", "privacy")}
    algo = type(run.algorithm)(type(run).__mro__[1](cfg=Recorder(cfg, "", seen), **fields))
    for t in range(2):
        algo.round(t)
    algo.evaluation_snapshot()
    return seen


#: (availability kind, privacy, local work, clock) of the matrix (tests/helpers/combinations.py): each
#: algorithm runs on those it accepts, so that its reads under privacy, the clock's cuts and slots,
#: over-selection and local epochs are recorded
SETTINGS = (("cohort", "gaussian", "fixed", "deadline"), ("markov", "none", "uniform", "slots"),
            ("always", "none", "epochs", "lognormal"), ("always", "none", "fixed", "none"),
            ("cohort", "none", "fixed", "overselect"))


def test_every_algorithm_reads_only_what_it_declares(tmp_path, monkeypatch):
    monkeypatch.setitem(C.ALGORITHM, "my_fedbuff_momentum", C.ALGORITHM["fedbuff"])
    torch.set_num_threads(1)
    C.steps_file(str(tmp_path))
    names, undeclared, checked = ours(), {}, set()
    for name in names:
        for kind, privacy, work, clock in SETTINGS:
            try:
                cfg = config.from_dict(C.Combo(name, kind, privacy, work, clock).data(str(tmp_path)), 1)
                build_components(cfg, World())
            except InputError:
                continue
            cls = ALGORITHMS.get(name).obj
            bad = sorted(k for k in read_keys(cfg) if not reads_within(cls, k))
            if bad:
                undeclared[name] = bad
            checked.add(name)
    assert not undeclared, undeclared
    assert checked == set(names)


def test_the_recorder_sees_a_read_nobody_declared(tmp_path):
    """The check above can fail: a plug-in reading train.lr without declaring it is caught."""

    class ReadsLr(FedAvgActive):
        configuration = ("scale",)

        def __init__(self, ctx):
            super().__init__(ctx)
            self.scale = 1.0 / ctx.cfg.train.lr

    if "reads_lr_undeclared" not in ALGORITHMS.names():
        register("reads_lr_undeclared")(ReadsLr)
    ReadsLr = ALGORITHMS.get("reads_lr_undeclared").obj
    C.steps_file(str(tmp_path))
    cfg = config.from_dict(C.Combo("reads_lr_undeclared", "always", "none", "fixed").data(str(tmp_path)), 1)
    assert "train.lr" in read_keys(cfg) and not reads_within(ReadsLr, "train.lr")

    class Declared(ReadsLr):
        uses = ("train.lr",)

    assert reads_within(Declared, "train.lr")


def test_capabilities_of_a_few_algorithms():
    fedavg, fedbuff, scaffold, dgd = (capabilities(ALGORITHMS.get(n).obj) for n in
                                      ("fedavg_active", "fedbuff", "scaffold", "dgd"))
    assert fedavg.trains == "server model" and fedavg.packs and fedavg.hooks == ("weights",)
    assert "x" in fedavg.server_state and fedavg.client_state == ()
    assert not fedbuff.packs  # its round is a server step, not the three phases
    assert scaffold.client_state == ("controls.rows",) and "local_terms" in scaffold.hooks
    assert "train.momentum" in scaffold.reads
    assert dgd.trains == "client models" and not dgd.packs and dgd.client_state == ("table.rows",)


def test_contradicting_declarations_are_refused_at_register():
    class Twice(ServerAlgorithm):
        shared_state = ("v",)
        derived = ("v",)

    with pytest.raises(TypeError, match="'v' in both derived and shared_state"):
        register("declares_twice")(Twice)

    class OwnBlock(ServerAlgorithm):
        uses = ("algorithm.global_lr",)

    with pytest.raises(TypeError, match="uses names 'algorithm.global_lr', a key of its own block"):
        register("uses_its_own_block")(OwnBlock)
