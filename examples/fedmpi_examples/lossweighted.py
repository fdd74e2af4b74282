"""Loss-weighted FedAvg, as a plug-in ``my_loss_weighted``: a client's change counts in
proportion to its mean training loss this round (q-FFL's idea with q = 1, without its step-size
normalisation; fedmpi ships q-FFL itself as ``qffl``).

    w_i     = ell_i / sum_{j in A_t} ell_j      (ell_i: client i's mean minibatch loss this round)
    x^{t+1} = x^t + eta_g sum_{i in A_t} w_i Delta_i            (A_t empty: x^t)

The per-client number comes from ``self.outputs`` (declared with ``client_outputs = True`` on the
class: the gather is opt-in), the round's ``ClientOutputs``: every active
client's ``loss``, ``first_loss``, ``steps``, ``delta_sq`` (with ``delta_norms = True`` on the
class) and ``samples``, in the order of
``self.outputs.ids``, the same bits on every rank; ``self.outputs.at(local)`` finds this rank's
clients and ``self.outputs.sum`` adds per-client numbers reproducibly. No extra pass: the losses
come from the training steps themselves.
"""

from __future__ import annotations

import numpy as np

from fedmpi.algorithms import ServerAlgorithm, register


@register("my_loss_weighted")
class LossWeighted(ServerAlgorithm):
    client_outputs = True  # reads self.outputs
    def weights(self, t: int, active: np.ndarray, local: np.ndarray) -> np.ndarray:
        out = self.outputs  # every rank holds all of A_t's numbers
        return out.loss[out.at(local)] / out.sum(out.loss)
