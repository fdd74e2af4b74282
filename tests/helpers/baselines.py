"""The centralized baselines' scenario on the quadratic task (``helpers.quadratic``): three
clients, a script of available sets with an empty round, and Delta_i from the server model."""

from __future__ import annotations

from helpers.quadratic import Q

U = [0.0, 8.0, -4.0]
M, X0 = len(U), 2.0
# an empty round; client 2 first seen at t = 2 after two absent rounds (FedAU's cap K = 2 is hit)
SCRIPT = [[0, 1], [], [2], [0, 1, 2], [1], [0, 2]]
PROBS = [[0.5, 0.25 + 0.125 * (t % 2), 0.75] for t in range(len(SCRIPT))]  # fedknown's true p_i^t


def delta(i: int, x: float) -> float:
    return (1 - Q) * (U[i] - x)  # Delta_i from the server model x
