"""What the accountant charges for secure aggregation's aborted rounds (#45, docs/PRIVACY.md "Dropouts and
aborts"; fedmpi/privacy/aggregation.py ``participation_decides_aborts``): under privacy a round aborts
only when its cohort is too small (dropouts are refused), so whether it aborts is a function of the
cohort. Where the cohort's size does not depend on one client (a fixed-size cohort, or a schedule the
accountant takes as public), an abort releases no row and charging it is conservative; under Poisson
sampling one client's presence can decide it, and amplification is not claimed."""

from __future__ import annotations

import copy
import logging

import numpy as np
import pytest
from conftest import synthetic_config

from fedmpi import config
from fedmpi.build import build_components
from fedmpi.errors import InputError
from fedmpi.privacy.aggregation import AggregationParams, plan
from fedmpi.runtime import World

pytest.importorskip("dp_accounting")

PRIVACY = {"mechanism": "gaussian", "clip": 0.2, "noise_multiplier": 0.8}
POISSON = {"kind": "stationary", "base": {"kind": "fixed", "values": 0.3}}


def run_config(aggregation: str, availability: dict, clients: int = 12, **privacy) -> dict:
    cfg = synthetic_config(algorithm={"name": "fedavg_active"}, privacy={**PRIVACY, **privacy},
                           aggregation={"kind": aggregation}, task__clients=clients)
    cfg["availability"] = copy.deepcopy(availability)
    return cfg


def test_a_cohort_of_one_aborts_so_poisson_sampling_can_decide_an_abort():
    """The fact the rule rests on: with the default threshold a lone client's round aborts, two do not;
    so under Poisson sampling, a cohort {u, v} runs and {v} (its neighbour without u) aborts."""
    params = AggregationParams(kind="secagg")
    assert plan(params, 1, 0, np.array([3])).aborted
    assert not plan(params, 1, 0, np.array([3, 7])).aborted


def test_under_poisson_sampling_secure_aggregation_claims_no_amplification():
    """The same run amplified with the plain sum is not with secure aggregation: the result file's note
    says why, naming aggregation.kind, and epsilon charges every participation (larger); with
    privacy.amplification: required it is refused in one line naming aggregation.kind."""
    plain = build_components(config.from_dict(run_config("plain", POISSON)), World()).privacy
    secure = build_components(config.from_dict(run_config("secagg", POISSON)), World()).privacy
    assert plain.amplified and not secure.amplified
    assert secure.notes()["privacy_amplification"].startswith("not claimed: aggregation.kind: secagg aborts")
    assert secure.epsilon(10) > plain.epsilon(10)
    with pytest.raises(InputError) as e:
        build_components(config.from_dict(run_config("secagg", POISSON, amplification="required")), World())
    said = str(e.value)
    assert said.startswith("privacy.amplification: required, but aggregation.kind: secagg") and "\n" not in said


def test_a_fixed_size_cohort_keeps_amplification_under_secure_aggregation():
    """availability.kind cohort: every round has the same number of clients in both neighbouring runs
    (replace-one), so an abort cannot depend on who took part: amplified as with the plain sum."""
    cohort = {"kind": "cohort", "size": 3}
    plain = build_components(config.from_dict(run_config("plain", cohort)), World()).privacy
    secure = build_components(config.from_dict(run_config("secagg", cohort)), World()).privacy
    assert plain.amplified and secure.amplified
    assert secure.epsilon(10) == plain.epsilon(10)


def test_an_aborted_round_is_charged_as_any_round_and_says_so(caplog):
    """Under Poisson sampling (not amplified) a round of one client aborts (4 clients, q = 0.3); the run's
    epsilon is the unamplified charge of every round, the same as with the plain sum and amplification off (the
    aborted rounds included: conservative, they released no row), and the log line says so."""
    run = build_components(config.from_dict(run_config("secagg", POISSON, clients=4)), World())
    same = build_components(config.from_dict(run_config("plain", POISSON, clients=4, amplification="off")),
                            World()).privacy
    logger = logging.getLogger("fedmpi.privacy.aggregation")  # fedmpi's loggers may not propagate to caplog's
    logger.addHandler(caplog.handler)
    aborted = []
    with caplog.at_level(logging.INFO, logger="fedmpi.privacy.aggregation"):
        for t in range(12):
            run.algorithm.round(t)
            if run.algorithm.round_record()["aggregation/aborted"]:
                aborted.append(t)
    logger.removeHandler(caplog.handler)
    assert 0 < len(aborted) < 12, aborted  # 4 clients at q = 0.3: a lone client w.p. 0.41 a round
    assert "no client's row is released; the accountant still charges the round's participants" in caplog.text
    assert run.privacy.epsilon(12) == same.epsilon(12)
