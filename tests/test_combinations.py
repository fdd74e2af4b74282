"""The combination matrix (issue #32, tests/helpers/combinations.py): every algorithm x availability
kind x privacy mechanism x local work is refused at start with one line naming the keys that
conflict, or runs and holds every invariant that applies:

- 1 and 2 ranks give the same bits, and a run cut at round 2 on one rank and resumed on two ends
  with them too (one ``mpiexec -n 2`` process runs every accepted combination);
- under privacy, the neighbouring-run check with the noise at 0 (tests/helpers/neighbours.py): a
  client that joins, leaves or changes its data leaves every other client's contribution unchanged
  and moves the private sum by at most the sensitivity the algorithm declares;
- where the accountant claims amplification by sampling, every round releases a step, an empty
  one too;
- on the clock, the runs that pack give in packed groups (``fedmpi sweep --pack``) the bits they
  give alone.

The clock crosses privacy, a production noise cohort, local work and packing (issue #44,
``C.clock_privacy``): a client whose data change (its sample count too) changes neither who the
clock keeps nor anyone else's contribution; a deadline on local epochs, which reads the sample
counts, is refused under privacy.

Secure aggregation (issue #45, ``aggregation.kind: secagg``) crosses every algorithm and mechanism
on the kinds whose cohorts stay at 2 or more when a client is toggled (a lone client aborts a
round); there the decoded sums hold the neighbouring-run check. The model axis (issue #42) runs
LoRA adapters of a tiny transformer over its frozen base with every algorithm and mechanism, and
of a tiny Hugging Face Llama where transformers is installed. Where a release shows who took part
(FedSWE: ``hides_participation=False``) the check's neighbours are zero-out ones, as its privacy
claim is. The default suite runs a spread of about 87 combinations (``sample``); the whole matrix
(~23500 combinations, about 810 of them the LoRA axis and 56 the Llama, about 760 secure
aggregation, about 2500 the clock under privacy; ~40 min on CI's 2 cores) is marked
``combinations`` and runs as its own step of .ci/run (``FEDMPI_MATRIX=full``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from conftest import ROOT, mpiexec
from helpers import combinations as C
from helpers.neighbours import check as neighbours

from fedmpi import config
from fedmpi.runtime import World

pytest.importorskip("dp_accounting")
SCRIPT = os.path.join(ROOT, "tests", "mpi_scripts", "combinations.py")


def matrix(combos: list[C.Combo], folder, two_ranks: bool = True) -> dict[str, list[str]]:
    """Check ``combos`` (see the module docstring); returns {"refused": [...], "ran": [...]}."""
    import torch

    torch.set_num_threads(1)
    folder = str(folder)
    C.steps_file(folder)
    world = World()
    refused, ran, results = [], [], {}
    for combo in combos:
        what, got = C.verdict(combo, folder, world)
        if what == "refused":
            assert "\n" not in got and got.split(":")[0].count(".") >= 1, f"{combo.name}: {got!r}"
            assert len(C.named(got, combo)) >= 2, f"{combo.name}: the refusal names one key only: {got!r}"
            refused.append(f"{combo.name}: {got}")
            continue
        cfg = got
        results[combo.name] = C.run(cfg, world)
        cut = os.path.join(folder, combo.name)
        os.makedirs(cut)
        C.run(cfg, world, stop=C.CUT, folder=cut)
        ran.append(combo.name)
        if cfg.privacy.mechanism != "none":
            quiet = config.from_dict(combo.data(folder, sigma=0.0))
            try:
                neighbours(quiet, 3, client=1)
                neighbours(quiet, 3, client=C.CHANGED if combo.clock != "none" else 4, change="data")
                from fedmpi.build import build_components

                if build_components(cfg, world).algorithm.privacy.amplified:
                    C.released_every_round(cfg, world)
            except AssertionError as e:  # name the combination (one failure stops the matrix)
                raise AssertionError(f"{combo.name}: {e}") from e
    timed = {n: config.from_dict(C.Combo(*n.split("-")).data(folder)) for n in ran if C.Combo(*n.split("-")).clock
             != "none"}
    for name, params in C.packed(timed, folder, world).items():
        assert np.array_equal(results[name], params), f"{name}: packed differs from alone"
    if two_ranks and ran:
        listing = os.path.join(folder, "list.json")
        with open(listing, "w") as fh:
            json.dump([{"name": n, "config": C.Combo(*n.split("-")).data(folder), "folder": os.path.join(folder, n)}
                       for n in ran], fh)
        out = os.path.join(folder, "two.npz")
        p = subprocess.run(mpiexec(2) + [sys.executable, SCRIPT, listing, out], capture_output=True, text=True,
                           timeout=3000, env=dict(os.environ, PYTHONPATH=ROOT), cwd=folder)
        assert p.returncode == 0, p.stderr[-3000:]
        two = np.load(out)
        for name in ran:
            assert np.array_equal(results[name], two[f"{name}/full"]), f"{name}: 1 and 2 ranks differ"
            assert np.array_equal(results[name], two[f"{name}/resumed"]), f"{name}: resumed on 2 ranks differs"
    return {"refused": refused, "ran": ran}


@pytest.mark.slow
@pytest.mark.mpi
def test_a_spread_of_the_matrix(tmp_path):
    combos = C.sample()
    got = matrix(combos, tmp_path)
    assert len(got["ran"]) >= 20 and len(got["refused"]) >= 10  # the spread exercises both


@pytest.mark.mpi
@pytest.mark.combinations
def test_the_whole_matrix(tmp_path):
    if os.environ.get("FEDMPI_MATRIX") != "full":
        pytest.skip("the whole matrix runs as its own step of .ci/run (FEDMPI_MATRIX=full)")
    combos = C.every()
    got = matrix(combos, tmp_path)
    counts = Counter(line.split(": ", 1)[1].split(":")[0] for line in got["refused"])
    print(f"\n{len(got['ran'])} combinations ran, {len(got['refused'])} refused; refusals by key: {dict(counts)}")
    assert len(got["ran"]) + len(got["refused"]) == len(combos)
