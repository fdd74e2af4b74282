"""Run FedSWE, MIFA and FedVARP on a small synthetic task on however many ranks launched us.

``python unavailability_check.py OUT_DIR`` (under mpiexec or alone) writes OUT_DIR/<name>.h5 for each
algorithm; ``tests/test_baselines.py`` imports ``run`` for the single-process reference and
compares the files bit for bit.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from conftest import synthetic_config  # noqa: E402
from fedmpi import config  # noqa: E402
from fedmpi.runner import Runner  # noqa: E402
from fedmpi.runtime.world import World  # noqa: E402

RUNS = {
    "fedswe": {"algorithm": {"name": "fedswe", "k": 3}},
    "mifa": {"algorithm": {"name": "mifa"}},
    "fedvarp": {"algorithm": {"name": "fedvarp"}},
}


def run(world: World, out_dir: str) -> None:
    for name, over in RUNS.items():
        data = synthetic_config(rounds=8, task__clients=13, availability__base__lo=0.1,
                                availability__base__hi=0.5, **over)
        Runner(config.from_dict(data, world.size), world, os.path.join(out_dir, f"{name}.h5"), quiet=True).run()


if __name__ == "__main__":
    w = World.create(device="cpu")
    run(w, sys.argv[1])
    w.close()
