"""Who is available when: availability dynamics, the Markov sampler, pi_R.

Importing the package registers every kind; use ``build(cfg.availability, info)``.
"""

from . import basic  # noqa: F401  (registers always, cohort, stationary)
from . import dynamics, markov, trace  # noqa: F401
from .base import Bernoulli, ClientInfo, Participation, build, mask, register  # noqa: F401
from .probs import base_probabilities  # noqa: F401
