"""Client-level differential privacy for the centralized algorithms (docs/PRIVACY.md).

- ``params``: the ``privacy:`` config section and its checks;
- ``sampling``: what the accountant needs to know about the availability model;
- ``accounting``: epsilon and noise calibration with Google's ``dp-accounting``;
- ``mechanism``: the clipping and the (banded) Gaussian noise that ``ServerAlgorithm.round`` applies.
"""

from .. import config as _config  # noqa: F401 -- loaded first: config imports .params, which uses config.opt
from .params import PrivacyParams, check

__all__ = ["PrivacyParams", "check"]
