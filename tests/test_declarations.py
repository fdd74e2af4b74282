"""What components declare of each other (issue #32): reads of other sections' keys, undeclared
state, and the combinations those declarations refuse with one line naming both keys."""

from __future__ import annotations

import h5py
import pytest
from conftest import fedmpi, synthetic_config, write_config

from fedmpi import config

FORGETFUL = '''
import numpy as np
from fedmpi.algorithms import register
from fedmpi.algorithms.fedavg import FedAvgActive


@register("forgetful")
class Forgetful(FedAvgActive):
    """Weights 1 / (1 + past participations), counted in an attribute it does not declare."""

    def __init__(self, ctx):
        super().__init__(ctx)
        self.seen = np.zeros(self.m)

    def weights(self, t, active, local):
        return 1.0 / ((1 + self.seen[local]) * max(len(active), 1))

    def after_round(self, t, active, local, start, end):
        self.seen[active] += 1
'''

LATE = '''
import numpy as np
from fedmpi.algorithms import register
from fedmpi.algorithms.fedavg import FedAvgActive


@register("late")
class Late(FedAvgActive):
    """The same count, made in the first round."""

    def weights(self, t, active, local):
        seen = getattr(self, "seen", np.zeros(self.m))
        return 1.0 / ((1 + seen[local]) * max(len(active), 1))

    def after_round(self, t, active, local, start, end):
        self.seen = getattr(self, "seen", np.zeros(self.m))
        self.seen[active] += 1
'''


def refused(tmp_path, cfg: dict, *args: str):
    p = fedmpi(["run", write_config(tmp_path / "c.yaml", cfg), "--quiet", "--out", str(tmp_path / "r.h5"), *args],
               check=False)
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, (p.returncode, p.stderr[-2000:])
    return p.stderr


@pytest.mark.slow
@pytest.mark.parametrize("source, name", [(FORGETFUL, "forgetful"), (LATE, "late")], ids=["init", "first_round"])
def test_state_that_is_neither_declared_nor_derived_is_refused(source, name, tmp_path):
    """An undeclared array would not be checkpointed: the resumed run would start it afresh and
    end elsewhere (issue #32: 5.516 against 4.556 after 12 rounds). Found after __init__, or after
    the first round before any checkpoint; the result file says the run failed."""
    plugin = tmp_path / f"{name}.py"
    plugin.write_text(source)
    err = refused(tmp_path, synthetic_config(algorithm={"name": name}), "--plugin", str(plugin))
    assert "seen" in err and "shared_state" in err
    if name == "late":
        with h5py.File(tmp_path / "r.h5") as f:
            assert f.attrs["status"] == "failed"


@pytest.mark.parametrize("name", ["dspodfl", "dgd", "dfedavg"])
@pytest.mark.parametrize("train", [{"local_steps_draw": "uniform"}, {"local_epochs": 1.0}],
                         ids=["draw", "epochs"])
def test_decentralized_algorithms_refuse_local_work_they_do_not_do(name, train):
    """They take one SGD step per iteration (the sporadicity draws who computes): a draw of local
    steps or local epochs would be silently ignored."""
    cfg = synthetic_config(algorithm={"name": name}, availability={"kind": "always"}, topology={"kind": "ring"},
                           train=train)
    key = next(iter(train))
    with pytest.raises(config.InputError, match=rf"train.{key}: .*algorithm.name {name}"):
        config.from_dict(cfg)


def test_a_single_base_probability_may_be_a_number():
    """#35 item 8: availability.base.values is documented as one p per client or a single p."""
    one = config.from_dict(synthetic_config(availability={"kind": "stationary",
                                                          "base": {"kind": "fixed", "values": 0.3}}))
    listed = config.from_dict(synthetic_config(availability={"kind": "stationary",
                                                             "base": {"kind": "fixed", "values": [0.3]}}))
    from fedmpi.build import build_components
    from fedmpi.runtime import World

    a, b = (build_components(c, World()).participation for c in (one, listed))
    assert (a.probabilities(0) == b.probabilities(0)).all() and a.probabilities(0)[0] == 0.3


def test_keys_a_component_reads_outside_the_resume_digest_join_it():
    """Privacy calibrated to a target epsilon reads ``rounds``: the resume digest then covers it (a
    resume or an extension with other rounds is refused); with a given noise multiplier it does not."""
    pytest.importorskip("dp_accounting", reason="a privacy config needs the [privacy] extra (dp-accounting)")
    target = config.from_dict(synthetic_config(privacy={"mechanism": "gaussian", "clip": 1.0, "epsilon": 8.0}))
    given = config.from_dict(synthetic_config(privacy={"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 1.0}))
    assert target.reads_outside_digest() == {"rounds": 6} and given.reads_outside_digest() == {}
    longer = config.from_dict(synthetic_config(rounds=9, privacy={"mechanism": "gaussian", "clip": 1.0,
                                                                  "epsilon": 8.0}))
    assert target.resume_differences(longer) == ["rounds"] and target.resume_digest() != longer.resume_digest()
    plain = config.from_dict(synthetic_config())
    assert plain.resume_digest() == config.from_dict(synthetic_config(rounds=9)).resume_digest()
