"""What a privacy mechanism is, and its registry (``privacy.mechanism``).

A mechanism makes a release of a sum private in two steps (pfl-research's seam): it bounds the
sensitivity (``bound``: each client's update clipped to L2 norm C, ``privacy.clipping``), then adds
noise, once on the server to the sum (central DP, ``noise_at = "server"``) or by each client to its
own update before the sum (local DP, ``noise_at = "clients"``). It owns the noise and everything
that follows from its shape (docs/PRIVACY.md):

- ``noise(t, dim)``: y_t, the release's noise direction at unit scale (``Privacy`` scales it by
  sigma C bound / divisor); rank 0 calls it once per release, in order; a local mechanism's
  ``client_noise(t, clients, dim)`` gives each client's instead (scaled by sigma C);
- its state (``shared_state``: saved by rank 0 in checkpoints, restored on every rank) and what
  that state costs (``state_bytes``, in the up-front memory check);
- ``sensitivity`` of one client's participation, in units of the clip C, and ``event``: the
  ``dp_accounting`` event of ``rounds`` rounds that the accountant composes, with its
  ``relation`` (add/remove or replace-one neighbours), amplified by the kind's sampling where
  ``amplifies`` says it has that analysis;
- ``check``: what it needs of the availability model's ``Sampling`` (banded MF: a minimum
  separation).

A plug-in mechanism is one file: a subclass registered with ``@register("name")``, with its own
keys as ``Params`` extending ``PrivacyParams`` (docs/PLUGINS.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Literal

import numpy as np
import torch

from .. import rng
from ..registry import MECHANISMS
from ..schema import Reads
from ..state import Stateful
from .params import PrivacyParams

if TYPE_CHECKING:
    from ..participation import Sampling
    from .clipping import Clip

Relation = Literal["add_or_remove", "replace_one"]


class Mechanism(Stateful):
    """Base of a mechanism (see the module docstring). ``__init__`` runs on every rank."""

    Params: type[PrivacyParams] = PrivacyParams
    #: where its noise goes: "server" (central: once, on the sum), "clients" (local: each update) or
    #: "distributed" (each client's share on the integer lattice, the sum decoded: ``lattice``)
    noise_at: Literal["server", "clients", "distributed"] = "server"
    #: its own Renyi DP curve (``rdp``) instead of a dp-accounting ``event``
    curve = False
    #: the most clients that can take part in one release (the run's clients; set by ``Privacy``)
    population = 1
    #: keys of other sections it reads: calibrating a target epsilon reads the run's rounds
    reads: tuple[Reads, ...] = (
        Reads("rounds", "calibrates the noise to privacy.epsilon over the run's rounds", lambda r: r >= 1,
              expect=">= 1", when=lambda cfg: cfg.privacy.epsilon is not None),)

    def __init__(self, params: PrivacyParams, dim: int, seed: int, device: torch.device, rounds: int = 0):
        """``rounds``: the run's rounds (``cfg.rounds``; 0 where no run is meant, e.g. a table of docs)."""
        self.params, self.dim, self.seed, self.device, self.rounds = params, dim, seed, device, rounds

    @classmethod
    def check_config(cls, cfg: Any) -> None:
        """Cross-key checks of a config that selects this mechanism (raise InputError)."""

    #: the key that sets how much state it keeps (the memory check names it)
    state_key = "privacy.mechanism"
    #: what it needs of the availability model beyond a description (docs/GUARANTEES.md; ``check`` enforces it)
    needs = ""

    @classmethod
    def state_bytes(cls, params: PrivacyParams, dim: int) -> int:
        """Bytes of state it keeps on every rank for a model of ``dim`` parameters."""
        return 0

    def check(self, cfg: Any, sampling: Sampling, amplified: bool) -> None:
        """What it needs of who takes part (raise InputError naming the keys)."""

    def bound(self, clip: Clip, t: int, start: torch.Tensor, end: torch.Tensor) -> torch.Tensor:
        """Bound the sensitivity: the end models of the rows' clients with their updates end - start
        bounded (every rank, its clients; default: L2 clipping to C, ``clip.bound``)."""
        return clip.bound(t, start, end)

    def noise(self, t: int, dim: int) -> torch.Tensor:
        """y_t, float64 (dim,) on the device, at unit scale (rank 0, releases in order; a central
        mechanism's)."""
        raise NotImplementedError

    def client_noise(self, t: int, clients: np.ndarray, dim: int) -> torch.Tensor:
        """Each client's noise in release t, float64 (len(clients), dim) on the device, at unit scale
        (a local mechanism's; every rank, its clients)."""
        raise NotImplementedError

    def amplifies(self, sampling: Sampling) -> bool:
        """Whether ``event`` has an amplified analysis for this sampling (asked only where the
        algorithm's release hides who took part); the default: none."""
        return False

    def sensitivity(self, sampling: Sampling, amplified: bool) -> float:
        """How far one client's participation can move what the noise covers, in units of C."""
        return 1.0

    def relation(self, sampling: Sampling, amplified: bool) -> Relation:
        """The neighbouring relation of ``event``."""
        return "add_or_remove"

    def event(self, sampling: Sampling, amplified: bool, sigma: float, rounds: int) -> Any:
        """The ``dp_accounting`` event of ``rounds`` rounds at noise multiplier ``sigma``."""
        raise NotImplementedError

    def rdp(self, sampling: Sampling, sigma: float, rounds: int) -> tuple[np.ndarray, np.ndarray]:
        """(orders, Renyi DP) of ``rounds`` rounds at noise multiplier ``sigma``, composed: a mechanism
        with ``curve = True`` (no dp-accounting event; never amplified), e.g. distributed noise."""
        raise NotImplementedError

    def record(self) -> dict[str, float]:
        """Its numbers of the last release for the result file (``privacy/<name>``; default none)."""
        return {}

    def notes(self) -> dict[str, str]:
        """What the result file's attributes name of it beyond its keys (banded_mf: the factor used)."""
        return {}


def standard_normal(seed: int, t: int, dim: int, device: torch.device) -> torch.Tensor:
    """z_t ~ N(0, I_dim), float64, from the keyed stream (seed, "privacy", t): the same on any number
    of ranks and after a resume."""
    return torch.from_numpy(rng.normal(rng.key(seed, "privacy", t), np.arange(dim))).to(device)


def register(name: str) -> Callable[[type[Mechanism]], type[Mechanism]]:
    """Class decorator: ``@register("gaussian") class Gaussian(Mechanism)``; its ``Params`` and
    ``check_config`` validate the ``privacy:`` block, its ``reads`` the keys of other sections."""

    def deco(cls: type[Mechanism]) -> type[Mechanism]:
        if not (isinstance(cls, type) and issubclass(cls, Mechanism)):
            raise TypeError(f"privacy mechanism {name!r}: register a subclass of fedmpi.privacy.Mechanism")
        return MECHANISMS.register(name, params=cls.Params, check=cls.check_config, reads=cls.reads)(cls)

    return deco


@register("none")
class NoMechanism(Mechanism):
    """``privacy.mechanism: none``: no clipping, no noise, nothing to account."""

    reads = ()
