"""Keeps the generated pages true: ``python -m fedmpi.docs`` rewrites the config reference
(docs/CONFIG.md), the tables of what works with what (docs/GUARANTEES.md), both from the
components' own declarations, and the plug-in API reference (docs/PLUGINS.md, ``fedmpi.apidoc``)."""

from __future__ import annotations

import dataclasses
import os
import re

from . import apidoc, plugins
from .config import reference
from .participation import ClientInfo
from .participation.probs import DATA_KINDS, WithBaseParams
from .privacy.aggregation import algorithm_refusal
from .privacy.declaration import Private, refusal
from .registry import ALGORITHMS, AVAILABILITY, MECHANISMS

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"
COMBINATIONS = "<!-- combinations:start -->", "<!-- combinations:end -->"


def config_table() -> str:
    """The config reference: one table per file that declares keys, in the order of the keys."""
    groups: dict[str, list[str]] = {}
    for owner, row in reference():
        groups.setdefault(owner, []).append(row)
    return "\n\n".join("\n".join([f"Declared in `{owner}`:", "", "| key | default | allowed | meaning |",
                                   "|---|---|---|---|", *rows]) for owner, rows in groups.items())


def combinations_table() -> str:
    """What works with what, from the declarations of the built-in components: each algorithm's
    availability, privacy and local work (``private``, ``reads``), each availability kind's sampling
    (``Participation.sampling`` of a small instance), each mechanism's needs."""
    plugins.load()
    rows = ["| algorithm | availability | privacy | secure aggregation | local work it refuses | other keys it reads |",
            "|---|---|---|---|---|---|"]
    for e in ALGORITHMS.entries(builtin_only=True):
        cls = e.obj
        availability = ("always only" if not cls.needs_participation else
                        "kinds that give p_i^t" if getattr(cls, "needs_probabilities", False) else "any kind")
        why = refusal(cls)
        decl = next(vars(c)["private"] for c in cls.__mro__ if "private" in vars(c)) if why is None else None
        privacy = (f"no: {why.removeprefix('is not covered by the privacy mechanism: ')}" if why is not None else
                   "yes, amplified by sampling" if isinstance(decl, Private) and decl.amplifiable else
                   "yes, each server step a release, counted per client (no amplification)"
                   if isinstance(decl, Private) and decl.counted else
                   "yes, without amplification (its release shows who took part)")
        refused = "; ".join(f"`{r.key}` other than {r.expect}" for r in cls.reads if r.supports) or "none"
        reads = ", ".join(f"`{r.key}`" for r in cls.reads if not r.supports) or "-"
        secure = algorithm_refusal(cls)
        secure = "yes" if secure is None else f"no: it {secure}"
        rows.append(f"| `{e.name}` | {availability} | {privacy} | {secure} | {refused} | {reads} |")
    kinds = ["| availability kind | sampling (privacy) | separation | gives p_i^t | reads the clients' data |",
             "|---|---|---|---|---|"]
    for e in AVAILABILITY.entries(builtin_only=True):
        params = (e.params or AVAILABILITY.get("always").params)()
        if hasattr(params, "schedule"):
            params = dataclasses.replace(params, schedule=[[0, 1], [2, 3]])
        model = e.obj(params, ClientInfo(m=12, seed=0, rounds=2))
        s = model.sampling(2)
        sampling = {"poisson": "Poisson, q = the largest p_i^t", "fixed_size": "uniform, fixed size"}.get(
            s.kind, "none to amplify")
        separation = ("measured from the trace" if s.counted else f"`{s.separation_key}`" if s.separation_key
                      else str(s.separation))
        data = (f"with `availability.base.kind`: {', '.join(DATA_KINDS)} (refused under privacy)"
                if isinstance(params, WithBaseParams) else "no")
        kinds.append(f"| `{e.name}` | {sampling} | {separation} | "
                     f"{'yes' if model.probabilities(0) is not None else 'no'} | {data} |")
    mechanisms = ["| privacy mechanism | amplification by sampling | needs |", "|---|---|---|"]
    for e in MECHANISMS.entries(builtin_only=True):
        if e.name == "none":
            continue
        mechanisms.append(f"| `{e.name}` | {_amplifies(e.obj)} | {e.obj.needs or '-'} |")
    return "\n".join(rows) + "\n\n" + "\n".join(kinds) + "\n\n" + "\n".join(mechanisms)


def _amplifies(cls: type) -> str:
    """The samplings mechanism ``cls`` has an amplified analysis for (``Mechanism.amplifies``), or 'no'."""
    import torch

    from .participation import Sampling

    mechanism = cls(cls.Params(), 1, 0, torch.device("cpu"))
    kinds = [text for kind, text in (("poisson", "Poisson sampling"), ("fixed_size", "a uniform sample of fixed size"))
             if mechanism.amplifies(Sampling(kind, 1.0, q=0.1, m=10, size=1, separation=2**31))]
    return ", ".join(kinds) or "no"


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REFERENCE = os.path.join(ROOT, "docs", "CONFIG.md")
GUARANTEES = os.path.join(ROOT, "docs", "GUARANTEES.md")
PLUGINS = os.path.join(ROOT, "docs", "PLUGINS.md")


def _rewrite(path: str, markers: tuple[str, str], body: str) -> bool:
    """Rewrite the text between ``markers`` in ``path``; True when the file changed."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    start, end = markers
    new = re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: f"{start}\n{body}\n{end}", text, flags=re.S)
    if new != text:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(new)
    return new != text


def update_reference(path: str = REFERENCE) -> bool:
    """Rewrite the config reference between the markers; True when the file changed."""
    return _rewrite(path, (START, END), config_table())


def update_combinations(path: str = GUARANTEES) -> bool:
    """Rewrite the tables of what works with what between their markers; True when the file changed."""
    return _rewrite(path, COMBINATIONS, combinations_table())


def update_plugin_api(path: str = PLUGINS) -> bool:
    """Rewrite the plug-in API reference between its markers; True when the file changed."""
    return _rewrite(path, apidoc.MARKERS, apidoc.page())


if __name__ == "__main__":
    for path, update in ((REFERENCE, update_reference), (GUARANTEES, update_combinations),
                         (PLUGINS, update_plugin_api)):
        print("updated" if update(path) else "up to date", path)
