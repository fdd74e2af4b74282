"""Combination matrix driver (tests/test_combinations.py), under ``mpiexec -n 2``: every listed
configuration run in full, and resumed from the one-rank checkpoint the test cut at round CUT.

    python combinations.py LIST.json OUT.npz

LIST.json: [{"name", "config", "folder"}, ...]; OUT.npz (rank 0): "<name>/full" and "<name>/resumed",
each the final model."""

import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from helpers.combinations import CUT, run  # noqa: E402

from fedmpi import config  # noqa: E402
from fedmpi.runtime import World  # noqa: E402


def main() -> None:
    listing, out = sys.argv[1], sys.argv[2]
    world = World.create("cpu", "gloo", 300, 1)
    with open(listing) as fh:
        items = json.load(fh)
    got = {}
    for item in items:
        cfg = config.from_dict(item["config"], world.size)
        full = run(cfg, world)
        resumed = run(cfg, world, start=CUT, folder=item["folder"])
        if world.rank == 0:
            got[f"{item['name']}/full"], got[f"{item['name']}/resumed"] = full, resumed
    if world.rank == 0:
        np.savez(out, **got)
    world.close()


if __name__ == "__main__":
    main()
