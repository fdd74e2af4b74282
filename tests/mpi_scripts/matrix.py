"""Determinism matrix driver: every algorithm family, a few rounds, in one process world.

    python matrix.py OUT_DIR full           # uninterrupted runs -> OUT_DIR/full-<size>.npz
    python matrix.py OUT_DIR interrupt      # runs stopped by SIGUSR1 at round 2 (checkpoints kept)
    python matrix.py OUT_DIR resume         # resume those checkpoints -> OUT_DIR/resumed-<size>.npz
    python matrix.py OUT_DIR packed         # the families that pack, in packed groups -> OUT_DIR/packed-<size>.npz
Run it under mpiexec with any number of ranks; the npz files hold each run's /final/params.
"""

import os
import sys

import h5py
import numpy as np

from fedmpi import config
from fedmpi.errors import Interrupted
from fedmpi.runner import Runner
from fedmpi.runtime import World, launched_size

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from fault_plugin import inject  # noqa: E402

BASE = {
    "seed": 5, "rounds": 6, "eval_every": 3,
    "task": {"dataset": "synthetic", "clients": 12, "model": "logreg", "partition": {"kind": "dirichlet", "alpha": 0.5},
             "synthetic": {"samples": 600, "test_samples": 100, "features": 8, "classes": 3}},
    "train": {"local_steps": 2, "batch_size": 4, "lr": 0.1},
    "availability": {"kind": "stationary", "base": {"kind": "uniform", "lo": 0.2, "hi": 0.9}},
    "runtime": {"progress": False, "threads": 1},
}
CASES = {
    "fedavg_active": {}, "fedavg_all": {}, "fedknown": {}, "gfedavg": {"algorithm": {"anchor_period": 2}},
    "fedau": {}, "f3ast": {"algorithm": {"select": 3}}, "mifa": {}, "fedvarp": {},
    "fedswe": {"algorithm": {"k": 3}},
    "fedavg_markov": {"availability": {"kind": "markov", "B": 2, "R": 2}},
    "debiased_fedavg": {"availability": {"kind": "markov", "B": 2, "R": 2}},
    "dspodfl": {"availability": {"kind": "always"}, "topology": {"kind": "ring"}},
    "dfedavg": {"availability": {"kind": "always"}, "topology": {"kind": "ring"},
                "sporadicity": {"sgd_prob": {"dist": "uniform", "lo": 0.3}}},
    "fedavgm": {}, "fedadam": {"algorithm": {"global_lr": 0.03}}, "fedyogi": {"algorithm": {"global_lr": 0.03}},
    "fedadagrad": {"algorithm": {"global_lr": 0.03}, "availability": {"kind": "markov", "B": 2, "R": 2}},
    "scaffold": {"train": {"momentum": 0.5}},
    "fedprox": {"algorithm": {"mu": 0.1}, "train": {"momentum": 0.9, "weight_decay": 1e-3}},
    "qffl": {"algorithm": {"q": 2.0}, "train": {"local_steps_draw": "uniform"}},
    "fednova": {"train": {"local_epochs": 0.5, "local_steps_draw": "uniform", "momentum": 0.5}},
    "fedexp": {"train": {"local_steps": 3}},
    "power_of_choice": {"algorithm": {"select": 2, "candidates": 4}},
}


def merged(name: str) -> dict:
    cfg = {k: (dict(v) if isinstance(v, dict) else v) for k, v in BASE.items()}
    cfg["algorithm"] = {"name": name}
    for k, v in CASES[name].items():
        cfg[k] = {**cfg.get(k, {}), **v}
    return cfg


def packed(out: str, world: World) -> dict:
    """Every case that packs, in groups of equal ``pack_key`` (fedmpi.packed); {name: final params}."""
    from fedmpi.packed import pack_key, plan, run_group

    cfgs = {name: config.from_dict(merged(name), launched_size()) for name in CASES}
    names = [n for n in CASES if pack_key(cfgs[n])[0] is not None]
    params = {}
    for group in plan([pack_key(cfgs[n]) for n in names], len(names)):
        paths = [os.path.join(out, f"packed{world.size}-{names[i]}.h5") for i in group]
        outcomes = run_group([cfgs[names[i]] for i in group], world, paths, [names[i] for i in group],
                             [()] * len(group), quiet=True)
        assert all(o.code == 0 for o in outcomes), outcomes
        for i, path in zip(group, paths):
            if world.rank == 0:
                with h5py.File(path, "r") as f:
                    params[names[i]] = f["final/params"][:]
    return params


def main() -> None:
    out, mode = sys.argv[1], sys.argv[2]
    world = World.create("cpu", "gloo", 120, 1)
    if mode == "packed":
        params = packed(out, world)
        if world.rank == 0:
            np.savez(os.path.join(out, f"packed-{world.size}.npz"), **params)
        world.close()
        return
    params = {}
    for name in CASES:
        cfg = config.from_dict(merged(name), launched_size())
        # a full run per world size (a result file is never silently replaced); resume continues the interrupted
        path = os.path.join(out, f"full{world.size}-{name}.h5" if mode == "full" else f"interrupt-{name}.h5")
        faults = [inject("0:2:usr1")] if mode == "interrupt" else []
        try:
            Runner(cfg, world, path, quiet=True, resume=(mode == "resume"), callbacks=faults).run()
        except Interrupted:
            continue
        if world.rank == 0:
            with h5py.File(path, "r") as f:
                params[name] = f["final/params"][:]
    if world.rank == 0 and mode != "interrupt":
        np.savez(os.path.join(out, f"{'full' if mode == 'full' else 'resumed'}-{world.size}.npz"), **params)
    world.close()


if __name__ == "__main__":
    main()
