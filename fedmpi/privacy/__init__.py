"""Client-level differential privacy for the centralized algorithms (docs/PRIVACY.md).

- ``params``: the ``privacy:`` config section and its checks;
- ``sampling``: what the accountant needs to know about the availability model;
- ``accounting``: epsilon and noise calibration with Google's ``dp-accounting``;
- ``mechanism``: the clipping and the (banded) Gaussian noise that ``ServerAlgorithm.round`` applies.
"""

from .params import PrivacyParams, check

__all__ = ["PrivacyParams", "check"]
