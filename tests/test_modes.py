"""Both server modes honour every hook an algorithm overrides, or refuse it at ``register`` with
one line naming the hook and the mode (#43 item 1): no hook is silently ignored."""

from __future__ import annotations

import numpy as np
import pytest

from fedmpi.algorithms import register
from fedmpi.algorithms.asynchronous import HONOURED
from fedmpi.algorithms.base import HOOKS, SWITCHES, ServerAlgorithm
from fedmpi.algorithms.fedavg import FedAvgActive
from fedmpi.algorithms.fedbuff import FedBuff
from fedmpi.engine.quantities import MEAN_SQUARED_LOSS

OVERRIDES = {"select": lambda self, t, available: available[:1],
             "failures": lambda self, t, failed, late: None,
             "start_models": lambda self, local: self.x.expand(len(local), -1),
             "lr_scale": lambda self, t, local: None,
             "local_terms": lambda self, t, local, start: (),
             "local_training": lambda self, t, local, start: start,
             "contribution": lambda self, t, active, local, start, end: end - start,
             "weights": lambda self, t, active, local: np.ones(len(local)),
             "private_part": lambda self, t, total: (total, 1.0, 1.0),
             "server_update": lambda self, t, active, total: self.x.double(),
             "after_round": lambda self, t, active, local, start, end: None,
             "client_outputs": True, "delta_norms": True, "client_quantities": (MEAN_SQUARED_LOSS,)}


def test_the_tables_name_every_overridable_hook():
    """Every name in HOOKS / SWITCHES is a member of ServerAlgorithm (a renamed hook fails here)."""
    assert set(OVERRIDES) == set(HOOKS) | set(SWITCHES)
    assert all(hasattr(ServerAlgorithm, h) for h in OVERRIDES)


@pytest.mark.parametrize("hook", sorted(set(OVERRIDES) - set(HONOURED)))
def test_an_async_plugin_overriding_an_ignored_hook_is_refused_at_register(hook):
    cls = type("Mine", (FedBuff,), {hook: OVERRIDES[hook], "__module__": __name__})
    with pytest.raises(TypeError) as e:
        register(f"async_with_{hook}")(cls)
    line = str(e.value)
    assert "\n" not in line and f"Mine.{hook}" in line and "asynchronous" in line, line


@pytest.mark.parametrize("hook", sorted(set(OVERRIDES)))
def test_the_synchronous_round_honours_every_hook(hook):
    cls = type("Mine", (FedAvgActive,), {hook: OVERRIDES[hook], "__module__": __name__})
    assert cls._unhonoured() is None


def test_client_state_is_refused_in_the_asynchronous_mode():
    cls = type("Mine", (FedBuff,), {"client_state": ("rows",), "__module__": __name__})
    with pytest.raises(TypeError, match=r"Mine.client_state: the asynchronous server"):
        register("async_with_client_state")(cls)


def test_clients_anywhere_beside_client_state_is_refused_not_ignored():
    cls = type("Mine", (FedAvgActive,), {"client_state": ("rows",), "__module__": __name__})  # inherits anywhere
    with pytest.raises(TypeError, match=r"Mine.clients_anywhere: the synchronous round ignores it beside "
                                        r"client_state"):
        register("anywhere_with_client_state")(cls)
    ok = type("Mine", (FedAvgActive,), {"client_state": ("rows",), "clients_anywhere": False, "__module__": __name__})
    assert ok._unhonoured() is None
