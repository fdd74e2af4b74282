"""State that resumes right by construction (#44 item 2): every attribute of an algorithm or an
availability model is declared state, derived or configuration (``fedmpi.state``); anything else,
scalars included, is refused after set-up and after the first round with one line naming it, and a
configuration attribute that a round reassigns is refused too. Declared scalar state (an int
counter, a float product) resumes bit for bit."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
from conftest import fedmpi, synthetic_config, write_config

from fedmpi import config, plugins
from fedmpi.runner import Runner
from fedmpi.runtime import World

#: a server Adam whose bias correction counts steps in plain numbers, the natural way to write it
ADAM = '''
import torch
from fedmpi.algorithms import register
from fedmpi.algorithms.base import ServerAlgorithm


@register("{name}")
class CountedAdam(ServerAlgorithm):
    """Adam on the mean update; bias correction 1 - beta1^t from a step counter, 1 - beta2^t from a product."""

    shared_state = ("m1", "m2"{state})
    configuration = ({configuration})

    def __init__(self, ctx):
        super().__init__(ctx)
        self.m1 = torch.zeros_like(self.x, dtype=torch.float64)
        self.m2 = torch.zeros_like(self.x, dtype=torch.float64)
        {init}

    def weights(self, t, active, local):
        return [1.0 / max(len(active), 1)] * len(local)

    def server_update(self, t, active, total):
        self.steps = getattr(self, "steps", 0) + 1
        self.beta2_t = getattr(self, "beta2_t", 1.0) * 0.99
        self.m1 = 0.9 * self.m1 + 0.1 * total
        self.m2 = 0.99 * self.m2 + 0.01 * total * total
        hat1, hat2 = self.m1 / (1 - 0.9 ** self.steps), self.m2 / (1 - self.beta2_t)
        return self.x.double() + 0.05 * hat1 / (hat2.sqrt() + 1e-3)
'''
INIT = "self.steps, self.beta2_t = 0, 1.0  # t and beta2^t"


def adam(name: str, state: str = "", configuration: str = "", init: str = INIT) -> str:
    return ADAM.format(name=name, state=state, configuration=configuration, init=init)


def small(name: str, rounds: int) -> dict:
    cfg = synthetic_config(algorithm={"name": name}, rounds=rounds, eval_every=50)
    cfg["task"].update(clients=8, synthetic={"samples": 320, "test_samples": 80, "features": 6, "classes": 3})
    cfg["train"].update(local_steps=2, batch_size=4)
    return cfg


@pytest.mark.parametrize("variant", ["init", "first_round", "configuration"])
def test_a_scalar_that_is_not_declared_state_is_refused_in_one_line(tmp_path, variant):
    """On main before #44 this ran, and a run of 150 rounds extended to 300 ended elsewhere than
    a straight run of 300 (the counter restarted at 0). Kept from __init__ or made in the first
    round, undeclared; or declared configuration and then counted: refused, the file says failed."""
    source = {"init": adam("counted"), "first_round": adam("counted", init="pass"),
              "configuration": adam("counted", configuration='"steps", "beta2_t"')}[variant]
    plugin = tmp_path / "counted.py"
    plugin.write_text(source)
    p = fedmpi(["run", write_config(tmp_path / "c.yaml", small("counted", 6)), "--quiet", "--out",
                str(tmp_path / "r.h5"), "--plugin", str(plugin)], check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stderr[-2000:])
    assert "error: algorithm.name: counted " in lines[0] and "'steps'" in lines[0] and "shared_state" in lines[0]
    assert ("changed 'steps'" in lines[0]) == (variant == "configuration")
    if variant != "init":
        with h5py.File(tmp_path / "r.h5") as f:
            assert f.attrs["status"] == "failed"


def test_declared_scalar_state_resumes_bit_for_bit(tmp_path):
    """The same plug-in declaring its int counter and float product as state: 150 rounds extended
    to 300 give the bits of a straight run of 300 (a Python float is saved as float64)."""
    plugin = tmp_path / "declared_adam.py"
    plugin.write_text(adam("declared_adam", state=', "steps", "beta2_t"'))
    plugins.load([str(plugin)])
    straight, extended = str(tmp_path / "straight.h5"), str(tmp_path / "extended.h5")
    assert Runner(config.from_dict(small("declared_adam", 300)), World(), straight, quiet=True).run() == 0
    assert Runner(config.from_dict(small("declared_adam", 150)), World(), extended, quiet=True).run() == 0
    assert Runner(config.from_dict(small("declared_adam", 300)), World(), extended, quiet=True).run() == 0
    with h5py.File(straight) as a, h5py.File(extended) as b:
        assert b.attrs["status"] == "completed" and b.attrs["rounds_done"] == 300
        np.testing.assert_array_equal(a["final/params"][:], b["final/params"][:])
        np.testing.assert_array_equal(a["metrics/test_loss"][:], b["metrics/test_loss"][:])


def test_every_builtin_and_example_component_declares_every_attribute(tmp_path, monkeypatch):
    """Each registered algorithm (the examples' plug-ins too) without and with privacy and on the
    clock, and each availability kind: nothing undeclared after set-up and after a round, no
    configuration attribute reassigned (``check_state``, as the runner calls it)."""
    import os

    import torch
    from conftest import ROOT
    from helpers import combinations as C

    from fedmpi.build import build_components, check_state
    from fedmpi.errors import InputError
    from fedmpi.registry import ALGORITHMS, AVAILABILITY

    plugins.load([os.path.join(ROOT, "examples", "fedmpi_examples")])
    monkeypatch.setitem(C.ALGORITHM, "my_fedbuff_momentum", C.ALGORITHM["fedbuff"])
    torch.set_num_threads(1)
    C.steps_file(str(tmp_path))
    ours = [e.name for e in ALGORITHMS if e.name in ALGORITHMS.names(builtin_only=True)
            or "fedmpi_examples" in e.obj.__module__]  # not what other tests of this process registered
    combos = [C.Combo(name, kind, privacy, work, clock) for name in ours
              for kind, privacy, work, clock in (("stationary", "none", "momentum", "none"),
                                                 ("markov", "gaussian", "fixed", "none"),
                                                 ("always", "none", "uniform", "lognormal"),
                                                 ("always", "none", "fixed", "none"))]
    combos += [C.Combo("fedavg_active", kind, "none", "fixed") for kind in AVAILABILITY.names(builtin_only=True)]
    checked: set[str] = set()
    for combo in combos:
        try:
            run = build_components(config.from_dict(combo.data(str(tmp_path)), 1), World())
        except InputError as e:
            assert "keeps" not in str(e), str(e)
            continue
        run.algorithm.round(0)
        check_state(run)
        checked |= {combo.algorithm, f"availability {combo.kind}"}
    kinds = {f"availability {k}" for k in AVAILABILITY.names(builtin_only=True)}
    assert "my_oort" in ours and checked >= {*ours, *kinds}


#: a plug-in server keeping one declared state ``{attr}`` (class ``{cls}``), set in __init__ to ``{value}``;
#: each round steps by the mean update as ``{update}`` (the body of server_update) says
ONE_STATE = '''
import decimal
import math
import torch
from fedmpi.algorithms import register
from fedmpi.algorithms.base import ServerAlgorithm


@register("{name}")
class {cls}(ServerAlgorithm):
    shared_state = ("{attr}",)

    def __init__(self, ctx):
        super().__init__(ctx)
        self.{attr} = {value}

    def weights(self, t, active, local):
        return [1.0 / max(len(active), 1)] * len(local)

    def server_update(self, t, active, total):
{update}
'''
#: state ``v`` deleted in the second round with DELETE
DECLARED = """        if {delete} and t == 1:
            del self.v
        return self.x.double() + 0.5 * total"""


@pytest.mark.parametrize("value, delete, says", [
    ("'abc'", False, "keeps str 'abc' as declared state 'v'"),
    ("None", False, "keeps NoneType 'None' as declared state 'v'"),
    ("decimal.Decimal('0.1')", False, "keeps Decimal '0.1' as declared state 'v'"),
    ("2 ** 100", False, "keeps int '1267650600228229401496703205376' as declared state 'v'"),
    ("3", True, "Kept declares 'v' state but has no such attribute"),
])
def test_declared_state_a_checkpoint_cannot_hold_is_one_line(tmp_path, value, delete, says):
    """#44's fresh hostile pass: declared state holding a string, None, a Decimal or an int beyond
    64 bits ended in a TypeError/ValueError traceback at the first checkpoint, and a declared
    attribute deleted in the second round in an AttributeError traceback. Now one line, exit 2:
    at set-up for the value, at the checkpoint for the deletion."""
    plugin = tmp_path / "kept.py"
    plugin.write_text(ONE_STATE.format(name="kept", cls="Kept", attr="v", value=value,
                                       update=DECLARED.format(delete=delete)))
    p = fedmpi(["run", write_config(tmp_path / "c.yaml", small("kept", 4)), "--quiet", "--out",
                str(tmp_path / "r.h5"), "--plugin", str(plugin)], check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and says in lines[0], (p.returncode, p.stderr[-2000:])
    assert delete or lines[0].startswith("fedmpi: error: algorithm.name: kept: Kept keeps")


def test_an_attribute_a_later_round_makes_is_refused_at_the_next_checkpoint(tmp_path):
    """#44's fresh hostile pass: the check ran after set-up and after the first round only, so a
    counter first set in round 3 (after a warm-up, say) ran to the end unnoticed and a resume
    restarted it. Every checkpoint checks again: one line naming it, exit 2."""
    plugin = tmp_path / "late.py"
    plugin.write_text(adam("late", state=', "steps", "beta2_t"', init="self.steps, self.beta2_t = 0, 1.0")
                      .replace("        self.m1 = 0.9", "        if t >= 2:\n            self.late = t\n"
                                                         "        self.m1 = 0.9"))
    cfg = small("late", 6)
    cfg["runtime"]["checkpoint_every"] = 1
    p = fedmpi(["run", write_config(tmp_path / "c.yaml", cfg), "--quiet", "--out", str(tmp_path / "r.h5"),
                "--plugin", str(plugin)], check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, (p.returncode, p.stderr[-2000:])
    assert lines[0].startswith("fedmpi: error: algorithm.name: late keeps 'late' (int, CountedAdam)"), lines[0]


#: the best (lowest) update norm so far, ``math.inf`` until a round improves on it, a full step only
#: while the round's update is below 10x it (a sentinel kept across checkpoints): ONE_STATE's ``best``
BEST = """        norm = float(total.norm())
        step = 1.0 if norm < self.best * 10 else 0.25
        self.best = min(self.best, norm) if t % 3 else self.best
        return self.x.double() + step * total"""


def best(name: str, value: str) -> str:
    return ONE_STATE.format(name=name, cls="Best", attr="best", value=value, update=BEST)


def test_an_infinite_declared_number_is_a_sentinel_that_resumes(tmp_path):
    """#44's fresh hostile pass: declared state ``math.inf`` (a best-so-far sentinel) ended as exit 4
    "diverged ... lower train.lr" at the first checkpoint, and a checkpoint holding it would have been
    refused at load. A number may be infinite (never NaN); 1 round extended to 6 (the sentinel still
    infinite at the cut) give the bits of a straight 6, and a NaN number still ends as diverged."""
    plugin = tmp_path / "best.py"
    plugin.write_text(best("best_inf", "math.inf"))
    plugins.load([str(plugin)])
    cfg = small("best_inf", 6)
    cfg["runtime"]["checkpoint_every"] = 1
    straight, extended = str(tmp_path / "straight.h5"), str(tmp_path / "extended.h5")
    assert Runner(config.from_dict(cfg), World(), straight, quiet=True).run() == 0
    assert Runner(config.from_dict({**cfg, "rounds": 1}), World(), extended, quiet=True).run() == 0
    assert Runner(config.from_dict(cfg), World(), extended, quiet=True).run() == 0
    with h5py.File(straight) as a, h5py.File(extended) as b:
        assert b.attrs["status"] == "completed" and b.attrs["rounds_done"] == 6
        np.testing.assert_array_equal(a["final/params"][:], b["final/params"][:])
    nan = tmp_path / "nan.py"
    nan.write_text(best("best_nan", "math.nan"))
    p = fedmpi(["run", write_config(tmp_path / "c.yaml", {**small("best_nan", 3), "runtime": cfg["runtime"]}),
                "--quiet", "--out", str(tmp_path / "n.h5"), "--plugin", str(nan)], check=False)
    assert p.returncode == 4 and "state 'algorithm/shared/best' is not finite" in p.stderr, p.stderr[-2000:]
