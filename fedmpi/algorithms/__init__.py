"""One small file per algorithm family; importing the package registers them all."""

from . import fedavg  # noqa: F401
from . import debiased  # noqa: F401
from . import f3ast, fedau, fedavg_all, fedknown, fedswe, fedvarp, gfedavg, mifa  # noqa: F401
from . import dspodfl  # noqa: F401
from .base import Algorithm, Context, ServerAlgorithm, build, register  # noqa: F401
