"""Who is available when: availability dynamics, the Markov sampler, pi_R.

Importing the package registers every kind, each with its own params class (an
``AvailabilityParams`` subclass; ``WithBaseParams`` for the kinds built on base probabilities);
use ``build(cfg.availability, info)``.
"""

from . import basic  # noqa: F401  (registers always, cohort, stationary)
from . import dynamics, markov, trace  # noqa: F401
from .base import (AvailabilityParams, Bernoulli, ClientInfo, Participation, Sampling, build, mask,  # noqa: F401
                   register)
from .probs import WithBaseParams, base_probabilities  # noqa: F401
