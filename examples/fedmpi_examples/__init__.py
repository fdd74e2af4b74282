"""An example fedmpi plug-in: an algorithm, a model and a dataset, each with its own parameters.

Load it with ``fedmpi run CONFIG --plugin examples/fedmpi_examples`` (or
``FEDMPI_PLUGINS=examples/fedmpi_examples``, or ``pip install -e examples`` for the entry point
``fedmpi.plugins``). Importing the package registers:

- algorithm ``my_fedavgm``: FedAvg with server momentum ``algorithm.beta`` (``fedavgm.py``; fedmpi
  ships the same rule as ``fedavgm``: this file shows how such an algorithm is written);
- algorithm ``my_loss_weighted``: FedAvg weighted by each client's training loss this round
  (``lossweighted.py``: how an algorithm reads the per-client numbers, ``ClientOutputs``);
- algorithm ``my_oort``: Oort-style selection by a utility from each client's per-sample training
  losses, with exploration (``oort.py``: a per-client quantity of local training, reproducible
  random draws, declared state, a privacy refusal);
- algorithm ``my_fedbuff_momentum``: asynchronous FedBuff with server momentum ``algorithm.beta``
  (``asyncmomentum.py``: an asynchronous algorithm on fedmpi's virtual clock, extending a built-in);
- model ``resmlp``: an MLP with residual blocks, ``task.width`` and ``task.blocks`` (``model.py``);
- dataset ``spirals``: interleaved 2-D spirals from numpy arrays, ``task.spiral_samples``,
  ``task.arms``, ``task.noise`` (``dataset.py``);
- privacy mechanism ``own_factor``: banded matrix-factorization noise with a factor of your own,
  ``privacy.factor`` (``mechanism.py``);
- adapter type ``my_ia3``: IA3's learned output scales over a frozen model, ``task.adapter.kind:
  my_ia3`` (``adapter.py``: an adapter type and its stacked rule).
"""

from . import adapter, asyncmomentum, dataset, fedavgm, lossweighted, mechanism, model, oort  # noqa: F401  (each registers its component)
