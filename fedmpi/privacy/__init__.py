"""Client-level differential privacy for the centralized algorithms (docs/PRIVACY.md).

- ``params``: the ``privacy:`` section's common keys and its config-time checks;
- ``declaration``: what an algorithm declares so that the mechanism applies (``Private``);
- ``mechanism``: what a mechanism is (it bounds the sensitivity, then adds noise: its noise, state,
  sensitivity and the DP event it hands the accountant) and its registry; the built-ins are one
  file each, ``gaussian`` (DP-FedAvg), ``banded`` (DP-FTRL's banded matrix-factorization noise) and
  ``local`` (local DP: each client's own noise), ``distributed`` (distributed DP: each client's share
  of discrete noise on the integer lattice, ``discrete`` its pure functions), and a plug-in adds one
  the same way;
- ``clipping``: bounding the sensitivity (each update clipped to C, fixed or adaptive);
- ``accounting``: epsilon and noise calibration with Google's dp-accounting; ``ledger``: the
  releases it composes (counted per client for an asynchronous server);
- ``run``: ``Privacy``, one run's privacy: the release of a sum the server asks for, and epsilon;
- ``aggregation``: how that sum is taken (the ``aggregation`` section): plain, or secure aggregation
  emulated with its arithmetic (``secagg``: quantization, masks, Shamir shares, unmasking).

Who takes part is the availability kind's to say (``Participation.sampling``): nothing here
knows a kind by name.
"""

from . import gaussian, banded, local, distributed  # noqa: F401  (register the built-in mechanisms, in this order)
from .declaration import Private
from .mechanism import Mechanism, register
from .params import PrivacyParams, check

__all__ = ["Mechanism", "Private", "PrivacyParams", "check", "register"]
