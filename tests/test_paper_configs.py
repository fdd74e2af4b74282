"""The paper-setting configs stay the papers' settings: an edit that drifts from them fails here.

Values (read from the papers, not from the files): FedSWE paper Sec. 7 and App. H (m = 100,
s = 10, batch 128, eta_g = 1, eta_0 = 0.1 for FedSWE, k = 100, Dirichlet(0.1), phi_c ~ U(0, Phi_c)
with Phi = 1 for the first half of the classes and 0.5 after (``phi_max: null``), gradient clip
0.5, crop for all and flip for CIFAR-10/CINIC-10; Sec. 7.2: sine with gamma = 0.3, P = 20,
inv_sqrt schedule, T = 2000, evaluation every 2 rounds; Sec. 7.1: P_delta = 100, constant step,
T = 10000 SVHN / 20000 CIFAR-10 (CINIC-10 as CIFAR-10), two groups of 5 classes); DSpodFL paper
Sec. 5 (m = 10, rgg radius 0.4, lr 0.01, batch 16; FMNIST: linear SVM, 1 class per client,
Beta(0.5, 0.5), delay 500; CIFAR-10: VGG11, 3 classes per client, Beta(0.8, 0.8), delay 5000;
Fig. 3: U(0, 1]); debiasing paper (N = 100 clients in M = 20 groups of B = 5).
"""

from __future__ import annotations

import os

import pytest

from conftest import ROOT
from fedmpi import config

FEDSWE = {"task.clients": 100, "train.local_steps": 10, "train.batch_size": 128, "train.lr": 0.1,
          "algorithm.global_lr": 1.0, "train.grad_clip": 0.5, "algorithm.name": "fedswe", "algorithm.k": 100,
          "availability.base.kind": "dirichlet_phi", "availability.base.phi_max": None,
          "availability.base.p_min": None, "task.partition.alpha": 0.1, "eval_every": 2}
SINE = {**FEDSWE, "availability.kind": "sine", "availability.gamma": 0.3, "availability.period": 20,
        "train.lr_schedule": "inv_sqrt", "rounds": 2000, "task.partition.kind": "dirichlet"}
PERIODIC = {**FEDSWE, "availability.kind": "periodic_groups", "availability.period": 100,
            "availability.window": "static", "train.lr_schedule": "constant", "task.partition.kind": "groups",
            "task.partition.groups": 2}
SVHN = {"task.dataset": "svhn", "task.model": "svhn_cnn", "train.augment": ["crop"]}
CIFAR = {"task.dataset": "cifar10", "task.model": "cifar_cnn", "train.augment": ["crop", "flip"]}
CINIC = {"task.dataset": "cinic10", "task.model": "cinic_cnn", "train.augment": ["crop", "flip"]}

DSPODFL = {"task.clients": 10, "topology.kind": "rgg", "topology.radius": 0.4, "train.lr": 0.01,
           "train.lr_schedule": "constant", "train.batch_size": 16, "task.partition.kind": "shards",
           "sporadicity.link_draw": "per_edge", "sporadicity.delay": "raw", "sporadicity.redraw_every": 0}


def beta(a: float) -> dict:
    return {f"sporadicity.{w}.{k}": v for w in ("sgd_prob", "link_prob")
            for k, v in (("dist", "beta"), ("a", a), ("b", a))}


UNIFORM01 = {f"sporadicity.{w}.{k}": v for w in ("sgd_prob", "link_prob")
             for k, v in (("dist", "uniform"), ("lo", 0.0), ("hi", 1.0))}

PINNED = {
    "unavailability/svhn_sine.yaml": {**SINE, **SVHN},
    "unavailability/cifar_sine.yaml": {**SINE, **CIFAR},
    "unavailability/cinic_sine.yaml": {**SINE, **CINIC},
    "unavailability/svhn_periodic.yaml": {**PERIODIC, **SVHN, "rounds": 10000},
    "unavailability/cifar_periodic.yaml": {**PERIODIC, **CIFAR, "rounds": 20000},
    "unavailability/cinic_periodic.yaml": {**PERIODIC, **CINIC, "rounds": 20000},
    "unavailability/example1_fedavg.yaml": {"task.u": [0.0, 100.0], "availability.kind": "stationary",
                                            "availability.base.values": [0.2, 0.8], "algorithm.name": "fedavg_active"},
    "unavailability/example1_fedswe.yaml": {"task.u": [0.0, 100.0], "availability.kind": "stationary",
                                            "availability.base.values": [0.2, 0.8], "algorithm.k": None},
    "unavailability/prop14_k0.yaml": {"task.u": [100.0, -100.0], "availability.kind": "cyclic",
                                      "availability.groups": 2, "algorithm.k": 0},
    "unavailability/prop14_k1.yaml": {"task.u": [100.0, -100.0], "availability.kind": "cyclic",
                                      "availability.groups": 2, "algorithm.k": 1},
    "dspodfl/fmnist_svm.yaml": {**DSPODFL, **beta(0.5), "task.dataset": "fmnist", "task.model": "linear_svm",
                                "task.partition.classes_per_client": 1, "sporadicity.max_delay": 500},
    "dspodfl/cifar_vgg11.yaml": {**DSPODFL, **beta(0.8), "task.dataset": "cifar10", "task.model": "vgg11",
                                 "task.partition.classes_per_client": 3, "sporadicity.max_delay": 5000},
    "dspodfl/fig3_sweeps.yaml": {**DSPODFL, **UNIFORM01, "task.dataset": "fmnist", "task.model": "linear_svm",
                                 "task.partition.classes_per_client": 1, "sporadicity.max_delay": 500},
    "markov/fmnist_groups.yaml": {"task.clients": 100, "availability.kind": "markov",
                                  "availability.markov_groups": 20, "availability.B": 5},
}


def get(cfg, dotted: str):
    for key in dotted.split("."):
        cfg = getattr(cfg, key)
    return cfg


@pytest.mark.parametrize("name", sorted(PINNED))
def test_paper_setting_is_pinned(name):
    cfg = config.load(os.path.join(ROOT, "configs", name))
    drift = {key: (get(cfg, key), want) for key, want in PINNED[name].items() if get(cfg, key) != want}
    assert not drift, f"{name} drifted from the paper (got, paper): {drift}"
