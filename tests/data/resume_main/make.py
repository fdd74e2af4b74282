"""Makes the stored runs of tests/test_resume_stored.py with the fedmpi on PYTHONPATH (they were
made with main at 4880dc6, before resume rules became declarations, #43 item 4):

    PYTHONPATH=<fedmpi checkout>:tests python tests/data/resume_main/make.py tests/data/resume_main

For each case CASE/: config.yaml (6 rounds); interrupted.h5 (+ .ckpt), stopped by SIGUSR1 in
round 2 and checkpointed after round 3; short.h5 (+ .ckpt), the same config completed with
rounds 4 (its final state kept, so that rounds 6 extends it). Each case is one branch the old
resume digest kept by hand ("old digests stay valid")."""

from __future__ import annotations

import os
import shutil
import sys

import yaml

import fault_plugin
from fedmpi import config
from fedmpi.errors import Interrupted
from fedmpi.runner import Runner
from fedmpi.runtime import World


def base(**over) -> dict:
    cfg = {"name": "stored", "seed": 5, "rounds": 6, "eval_every": 2,
           "task": {"dataset": "synthetic", "clients": 8, "model": "logreg",
                    "partition": {"kind": "dirichlet", "alpha": 0.5},
                    "synthetic": {"samples": 320, "test_samples": 80, "features": 6, "classes": 3}},
           "train": {"local_steps": 2, "batch_size": 4, "lr": 0.1},
           "availability": {"kind": "stationary", "base": {"kind": "uniform", "lo": 0.3, "hi": 0.9}},
           "runtime": {"progress": False, "checkpoint_every": 1}}
    for key, value in over.items():
        config._set_dotted(cfg, key, value)
    return cfg


CASES = {
    "fedavg": base(),                                                     # every default
    "global_lr": base(**{"algorithm.global_lr": 0.5}),                    # eta_g hashed under train
    "privacy": base(**{"algorithm.name": "fedavg_active",                 # privacy section, band 1, rdp
                       "privacy": {"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 0.5},
                       "availability": {"kind": "stationary", "base": {"kind": "fixed", "values": [0.5] * 8}}}),
    "clock": base(**{"clock": {"kind": "constant", "step_time": 1.0, "comm_time": 0.5, "deadline": 2.0},
                     "train.local_steps_draw": "uniform"}),               # clock section only when on
    "local_test": base(**{"task.partition.local_test": 0.25}),            # omitted when off
    "lognormal": base(**{"train.local_steps_draw": "lognormal", "train.local_steps_sigma": 0.7,
                         "train.local_steps": 3}),                        # a draw's own parameter
    "fedswe": base(**{"algorithm.name": "fedswe"}),                       # max_echo null omitted
    "dgd": base(**{"algorithm.name": "dgd", "availability": {"kind": "always"},
                   "topology": {"kind": "ring"}}),                        # no server: eta_g 1.0
}


def make(folder: str, name: str, data: dict) -> None:
    where = os.path.join(folder, name)
    shutil.rmtree(where, ignore_errors=True)
    os.makedirs(where)
    with open(os.path.join(where, "config.yaml"), "w") as fh:
        yaml.safe_dump(data, fh, sort_keys=False)
    cfg = config.from_dict(data)
    try:
        Runner(cfg, World(), os.path.join(where, "interrupted.h5"), quiet=True,
               callbacks=[fault_plugin.inject("0:2:usr1")]).run()
        raise SystemExit(f"{name}: the run was not interrupted")
    except Interrupted:
        pass
    short = config.from_dict({**data, "rounds": 4})
    assert Runner(short, World(), os.path.join(where, "short.h5"), quiet=True).run() == 0


if __name__ == "__main__":
    for case, data in CASES.items():
        make(sys.argv[1], case, data)
        print("made", case)
