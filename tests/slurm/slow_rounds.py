"""Test plug-in: every round sleeps ``$FEDMPI_TEST_ROUND_S`` seconds, so that a tiny run lasts long
enough for a scheduler's signal to find it mid-run. Results are unchanged."""

from __future__ import annotations

import os
import time

from fedmpi.registry import CALLBACKS

CALLBACKS.register("test_slow_rounds", lambda run, t: time.sleep(float(os.environ.get("FEDMPI_TEST_ROUND_S", "0"))))
