"""One small file per algorithm family; importing the package registers them all, in this order
(the order of the registry's names, whichever module is imported first)."""

from . import fedavg, fedavg_all, fedknown, gfedavg, fedau, f3ast, mifa, fedvarp, fedswe  # noqa: F401
from . import fedopt, fedprox, scaffold  # noqa: F401
from . import debiased  # noqa: F401
from . import qffl, fednova, fedexp, power_of_choice  # noqa: F401
from . import fedbuff, fedasync  # noqa: F401
from . import dspodfl  # noqa: F401
from .base import (Algorithm, AlgorithmParams, ClientOutputs, Context, ServerAlgorithm, ServerParams,  # noqa: F401
                   Snapshot, register)
