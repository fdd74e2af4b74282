"""Capabilities declared once per algorithm (#43 item 3, ``fedmpi.algorithms.capabilities``): what it
trains, what state it keeps where, which hooks it overrides, what it reads from other sections;
contradicting declarations are refused at ``register``; ``packs`` is derived; every built-in and
example algorithm runs on its scoped config (``Context.cfg``: its own keys and those it declares) and
each key it declares is one of the config's; a plug-in reading another key fails in one line."""

from __future__ import annotations

import os

import pytest
import torch
from conftest import ROOT, synthetic_config, write_config
from helpers import combinations as C

from fedmpi import cli, config, plugins
from fedmpi.algorithms import ServerAlgorithm, register
from fedmpi.algorithms.capabilities import UndeclaredRead, capabilities
from fedmpi.build import build_components
from fedmpi.errors import InputError
from fedmpi.registry import ALGORITHMS
from fedmpi.runtime import World


def ours() -> list[str]:
    plugins.load([os.path.join(ROOT, "examples", "fedmpi_examples")])
    return [e.name for e in ALGORITHMS if e.name in ALGORITHMS.names(builtin_only=True)
            or "fedmpi_examples" in e.obj.__module__]


def run_briefly(cfg: config.Config) -> None:
    """Set-up, two rounds and an evaluation of ``cfg``'s algorithm, on its scoped config
    (``Context.cfg``, ``capabilities.scoped``): a read of an undeclared key raises."""
    algo = build_components(cfg, World()).algorithm
    for t in range(2):
        algo.round(t)
    algo.evaluation_snapshot()


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
                run_briefly(config.from_dict(C.Combo(name, kind, privacy, work, clock).data(str(tmp_path)), 1))
            except UndeclaredRead as e:
                undeclared[name] = str(e)
            except InputError:  # a combination it refuses
                continue
            checked.add(name)
    assert not undeclared, undeclared
    assert checked == set(names)


def test_declared_reads_are_keys_of_the_config():
    """Every key a built-in or example algorithm declares it reads (``reads``, ``uses``) and each
    section of its own is in the config reference (``config.reference``): a misspelt declaration
    would let nothing through and fail only on the combination that reads it."""
    keys = [row.split("`")[1] for _, row in config.reference()]
    missing = {name: [k for k in (*capabilities(ALGORITHMS.get(name).obj).reads, *ALGORITHMS.get(name).obj.sections)
                      if not any(r == k or r.startswith(k + ".") for r in keys)] for name in ours()}
    assert not {n: m for n, m in missing.items() if m}
    assert "availability.size" in capabilities(ALGORITHMS.get("fedavg_active").obj).reads  # a key read somewhere


READS_LR = """
from fedmpi.algorithms import register
from fedmpi.algorithms.fedavg import FedAvgActive


@register("reads_lr_undeclared")
class ReadsLr(FedAvgActive):
    configuration = ("scale",)

    def __init__(self, ctx):
        super().__init__(ctx)
        self.scale = 1.0 / ctx.cfg.train.lr
"""


def test_a_plugin_reading_an_undeclared_key_fails_in_one_line(tmp_path, capsys):
    """A plug-in algorithm whose code reads ``train.lr`` without declaring it: ``fedmpi run`` exits 2
    with one line naming the key, the algorithm and the fix; declared, it runs."""
    plugin = tmp_path / "reads_lr.py"
    plugin.write_text(READS_LR)
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(output=str(tmp_path / "r.h5"), rounds=1,
                                                             algorithm={"name": "reads_lr_undeclared"}))
    capsys.readouterr()
    assert cli.main(["run", cfg, "--plugin", str(plugin), "--quiet"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["fedmpi: error: train.lr: algorithm 'reads_lr_undeclared' reads this key without declaring "
                     "it (add 'train.lr' to ReadsLr.uses)"], lines
    ReadsLr = ALGORITHMS.get("reads_lr_undeclared").obj

    class Declared(ReadsLr):
        uses = ("train.lr",)

    register("reads_lr_declared")(Declared)
    data = synthetic_config(rounds=1, algorithm={"name": "reads_lr_declared"})
    assert build_components(config.from_dict(data), World()).algorithm.scale == 1.0 / data["train"]["lr"]
    view = build_components(config.from_dict(data), World()).algorithm.cfg.train
    with pytest.raises(UndeclaredRead, match="^train.local_steps: algorithm 'reads_lr_declared' reads"):
        assert view.local_steps is None  # never reached: the read raises


def test_a_refusal_reads_only_declared_keys():
    """ServerAlgorithm's refusal of a kind without p_i^t names availability.kind, which it declares
    (SETTINGS pairs markov with the clock's slots, which fedknown's check_config refuses first)."""
    data = synthetic_config(rounds=1, algorithm={"name": "fedknown"}, availability={"kind": "markov"})
    with pytest.raises(InputError, match="^availability.kind: fedknown needs the true p_i.t, which 'markov'"):
        build_components(config.from_dict(data), World())


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

    class Packs(ServerAlgorithm):
        packs = False

    with pytest.raises(TypeError, match="Packs.packs is derived from its round"):
        register("declares_packs")(Packs)
