"""What an algorithm declares so that client-level DP applies to it (docs/PRIVACY.md, "Which
algorithms"), and the one rule that reads the declaration.

An algorithm class sets ``private``:

- ``Private(...)``: the mechanism applies. Where the clipped updates enter the summed rows and what
  divides them is ``ServerAlgorithm.private_part`` (by default: all rows, each update weighted
  1 / n~, n~ the fixed expected cohort); the fields say the rest.
- a string: why the mechanism cannot apply (refused under ``privacy:`` with that reason);
- None (the default): nothing declared, refused with one line saying what to declare.

The declaration covers the hooks that decide what is released (``HOOKS``) where they are defined
at or above the class that declares it: a subclass that overrides one of them (a plug-in's own
``select``) inherits no declaration and must make its own.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import InputError


@dataclass(frozen=True)
class Private:
    """An algorithm's privacy declaration.

    ``selection_reads_data``: ``select`` reads client data (losses, norms, sample counts), so who
    takes part is itself a release the noise does not cover (refused); ``empty_round_releases``: a
    round with no client still releases a step (the noise alone), so a release does not show that
    a round was empty; ``hides_participation``: the release depends on who took part only through
    the noisy sum (no realised count, no participant's own model). The accountant claims
    amplification by sampling only with both of the last two. ``counted``: its releases are an
    asynchronous server's steps, whose contributors the clock's public schedule decides (not the
    availability kind's draw): the accountant counts the releases each client contributed to
    (``fedmpi.privacy.ledger``), without amplification."""

    selection_reads_data: bool = False
    empty_round_releases: bool = True
    hides_participation: bool = True
    counted: bool = False

    @property
    def amplifiable(self) -> bool:
        """Whether amplification by sampling may be claimed for this algorithm's releases."""
        return self.empty_round_releases and self.hides_participation


#: the hooks whose definitions a declaration vouches for: what enters the sum (``weights``,
#: ``contribution``, ``private_part``; an asynchronous server's ``keep``, ``weight`` and ``buffered``, the
#: released sum), who takes part (``select``), what is released (``server_update``)
HOOKS = ("weights", "contribution", "private_part", "select", "server_update", "keep", "weight", "buffered")


def declaration(cls: type, name: str) -> Private:
    """``cls``'s privacy declaration (the algorithm registered as ``name``); InputError naming
    ``privacy.mechanism`` and the algorithm when it has none, refuses privacy, or does not cover a hook."""
    decl, why = _read(cls)
    if why is not None:
        raise InputError(f"privacy.mechanism: algorithm.name {name!r} {why}")
    return decl


def refusal(cls: type) -> str | None:
    """Why the privacy mechanism does not apply to ``cls`` (None: it does)."""
    return _read(cls)[1]


def _read(cls: type) -> tuple[Private | None, str | None]:
    owner = next((c for c in cls.__mro__ if "private" in vars(c)), None)
    decl = None if owner is None else vars(owner)["private"]
    if decl is None:
        return None, (f"declares nothing about privacy: set `private = Private(...)` on {cls.__name__} "
                      f"(fedmpi.privacy: where its clipped updates enter the sum, whether its selection reads "
                      f"client data, whether an empty round releases a step; docs/PLUGINS.md)")
    if isinstance(decl, str):
        return None, f"is not covered by the privacy mechanism: {decl}"
    for hook in HOOKS:
        definer = next((c for c in cls.__mro__ if hook in vars(c)), None)
        if definer is not None and definer is not owner and issubclass(definer, owner):
            return None, (f"({cls.__name__}): {definer.__name__}.{hook} overrides what {owner.__name__}'s privacy "
                          f"declaration covers; declare `private = Private(...)` in {definer.__name__} "
                          f"(docs/PLUGINS.md)")
    if decl.selection_reads_data:
        return None, ("selects clients by their data (its select reads client data), which the noise on the sum "
                      "does not protect")
    return decl, None
