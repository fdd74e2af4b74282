"""Makes the stored runs of tests/test_resume_stored.py written by main at f400d91 (the last main
whose resume digest was the hand-kept list, #43 item 4): the cases added after the runs of
tests/data/resume_main (4880dc6) were stored. Same layout and procedure (``resume_main/make.py``):

    PYTHONPATH=<fedmpi checkout>:tests python tests/data/resume_f400d91/make.py tests/data/resume_f400d91
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "resume_main"))
from make import base, make  # noqa: E402  (the 4880dc6 runs' recipe)

CASES = {
    "lora": base(**{"task.model": "mlp",                                 # the adapter block kept
                    "task.adapter": {"kind": "lora", "r": 2, "alpha": 4.0, "target_modules": ["fc1", "out"]}}),
    "local_gaussian": base(privacy={"mechanism": "local_gaussian", "clip": 1.0, "noise_multiplier": 0.5},
                           availability={"kind": "stationary", "base": {"kind": "fixed", "values": [0.5] * 8}}),
    "banded_mf": base(**{"privacy": {"mechanism": "banded_mf", "band": 3, "clip": 1.0, "noise_multiplier": 0.5,
                                     "accountant": "pld"},                # band its own key; accountant not rdp
                         "algorithm.name": "debiased_fedavg", "availability": {"kind": "markov", "B": 2, "R": 2}}),
    "fedbuff": base(algorithm={"name": "fedbuff", "concurrency": 3, "buffer": 2},  # server steps in flight
                    availability={"kind": "always"}, clock={"kind": "constant", "step_time": 1.0, "comm_time": 0.5}),
}

if __name__ == "__main__":
    for case, data in CASES.items():
        make(sys.argv[1], case, data)
        print("made", case)
