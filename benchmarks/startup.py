"""Start-up time of the commands that never train, against a bare ``import torch``.

    python benchmarks/startup.py [REPEATS]

Each command runs REPEATS times (default 5) in a fresh interpreter; the median wall time is
printed with its ratio to ``python -c "import torch"``, measured in the same run. ``fedmpi
--help``, ``info``, ``table`` and ``sweep --list`` import only the module of their command
(fedmpi/cli.py), so they should stay well below 1 (they load h5py and numpy, not torch).
(``sweep --status`` checks every cell's config against the registries of algorithms, models
and datasets, which imports torch.)
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def wall(args: list[str], repeats: int) -> float:
    env = dict(os.environ, PYTHONPATH=ROOT)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run([sys.executable, *args], env=env, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    import numpy as np

    from fedmpi import config
    from fedmpi.results.hdf5 import ResultWriter, claim

    with tempfile.TemporaryDirectory() as tmp:
        run = os.path.join(tmp, "r.h5")
        cfg = config.from_dict({})
        w = ResultWriter(run, cfg.to_yaml(), 0, 1, ["test_acc"], 10, False, claim_=claim(run, cfg.resume_digest()))
        w.append({"round": 0, "test_acc": 0.5}, 0)
        w.finish("completed", np.zeros(1), 0)
        sweep = os.path.join(tmp, "s.sweep.yaml")
        with open(sweep, "w") as fh:
            fh.write(f"base: {os.path.join(ROOT, 'configs/quickstart.yaml')}\nout: {tmp}/sw\ngrid: {{seed: [0, 1]}}\n")
        base = wall(["-c", "import torch"], repeats)
        print(f"python -c 'import torch': {base:.2f} s (median of {repeats})")
        for name, args in (("fedmpi --help", ["-m", "fedmpi", "--help"]),
                           ("fedmpi info RUN", ["-m", "fedmpi", "info", run]),
                           ("fedmpi table RUN", ["-m", "fedmpi", "table", run]),
                           ("fedmpi sweep --list", ["-m", "fedmpi", "sweep", sweep, "--list"])):
            t = wall(args, repeats)
            print(f"{name:<24} {t:.2f} s  = {t / base:.2f} x import torch")


if __name__ == "__main__":
    main()
