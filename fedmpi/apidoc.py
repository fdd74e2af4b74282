"""The plug-in API reference (docs/PLUGINS.md, between its markers), generated from the code:
signatures from ``inspect``, descriptions from docstrings and the comments beside declarations,
and each algorithm hook's contract (ranks, collective, what it may change) from the tables of
``fedmpi/algorithms/base.py``'s docstring, where the round is written. ``python -m fedmpi.docs``
rewrites it; tests/test_docs.py fails when the page, a signature or a contract drifts, and when a
public method of ``ServerAlgorithm`` has neither a contract row nor a place among the helpers."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
from typing import Any, Callable

from . import metrics, rng
from .algorithms import base
from .data import datasets
from .engine import quantities
from .metrics import MetricInput
from .participation import base as participation
from .privacy import mechanism
from .registry import CALLBACKS
from .state import Stateful

MARKERS = "<!-- plugin-api:start -->", "<!-- plugin-api:end -->"

#: public methods of ``ServerAlgorithm`` that are helpers to call, not hooks the round calls
HELPERS = ("assigned", "cohort", "outputs", "reads_outputs", "trains_by_default")

#: what an algorithm instance holds after ``ServerAlgorithm.__init__`` (name -> (what, after a resume));
#: tests/test_docs.py checks that this covers every attribute of a built one
ATTRIBUTES = {
    "ctx": ("the ``Context``: config, world, task, trainer, participation", "rebuilt"),
    "cfg": ("the run's resolved ``Config``, scoped: its own keys and those it declares (``self.cfg.seed``, "
            "``self.cfg.train.batch_size``, ...)", "rebuilt"),
    "params": ("the ``algorithm`` block: an instance of the class's ``Params``", "rebuilt"),
    "world": ("the ``World``: ``rank``, ``size``, ``is_server``, ``broadcast_`` ...", "rebuilt"),
    "m": ("the number of clients", "rebuilt"),
    "eta_g": ("eta_g, ``algorithm.global_lr``", "rebuilt"),
    "x": ("x^t, the global model, a flat float32 tensor, identical on every rank", "restored (shared_state)"),
    "active": ("the last round's cohort A_t (for its mask)", "empty until the first round"),
    "_outputs": ("behind ``self.outputs``: this round's ``ClientOutputs``", "None until the first round"),
    "_sizes": ("the clients' sample counts n_i (float64)", "rebuilt"),
    "privacy": ("the run's ``fedmpi.privacy.Privacy`` (``ctx.privacy``): ``on``, ``noisy``, ``cohort``, ``sigma``, "
                "``C``; ``release`` makes a sum private", "restored (sigma, C, its mechanism's and ledger's state)"),
    "stats": ("this round's ``LocalStats`` (set in ``begin_round``; filled by the training)", "set each round"),
    "clock": ("the server's scheduler (``fedmpi.clock.scheduler``): ``available(t)``, ``keep(t, selected)``, "
              "``virtual_time()``; availability in time, the clock, the tasks in flight",
              "rebuilt; its state restored (``now``, the availability step, the tasks in flight)"),
}


# ----------------------------------------------------------------------------- reading the code

def summary(obj: Any) -> str:
    """The first paragraph of ``obj``'s docstring, on one line ("" without one)."""
    doc = inspect.getdoc(obj) or ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def signature(fn: Callable, name: str | None = None) -> str:
    """``name(args)`` without ``self``/``cls`` and without annotations (short enough for a table)."""
    target = fn.fget if isinstance(fn, property) else fn
    name = name or target.__name__
    if isinstance(fn, property):
        return name
    params = [p.replace(annotation=p.empty, default=_Shown(p.default) if _is_class(p) else p.default)
              for p in inspect.signature(target).parameters.values() if p.name not in ("self", "cls")]
    return f"{name}({', '.join(str(p) for p in params)})"


def _is_class(p: inspect.Parameter) -> bool:
    return isinstance(p.default, type) and p.default is not p.empty


class _Shown:
    """A class default shown by its name."""

    def __init__(self, cls: type):
        self.name = cls.__name__

    def __repr__(self) -> str:
        return self.name


def comments(cls: type) -> dict[str, str]:
    """{attribute: its comment} for the assignments in ``cls``'s body (``#:`` lines above, or a
    ``#`` comment at the end of the line) and the ``self.name = ...`` lines of its methods."""
    lines, _ = inspect.getsourcelines(cls)
    source = textwrap.dedent("".join(lines))
    text = source.splitlines()
    found: dict[str, str] = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [t.id if isinstance(t, ast.Name) else t.attr for t in targets
                     if isinstance(t, ast.Name) or (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                                                    and t.value.id == "self")]
            line = text[node.end_lineno - 1]
            note = line.split("  # ", 1)[1].strip() if "  # " in line else ""
            above = []
            k = node.lineno - 2
            while k >= 0 and text[k].strip().startswith("#:"):
                above.insert(0, text[k].strip()[2:].strip())
                k -= 1
            for n in names:
                found.setdefault(n, " ".join(above) or note)
    return found


def contracts() -> dict[str, dict[str, str]]:
    """{method: {column: cell}} from the tables of ``fedmpi/algorithms/base.py``'s docstring: a row
    names the methods it is about in its first cell (``name(...)``). The steps of the round come
    first (what a plug-in overrides most), then the phases, then what the runner calls; a table
    without a "collective" column has it from its "ranks" cell."""
    tables: list[list[tuple[str, dict[str, str]]]] = []
    head: list[str] = []
    for line in (base.__doc__ or "").splitlines():
        if not line.startswith("|"):
            head = []
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not head:
            head = cells
            tables.append([])
            continue
        if set(line) <= set("|- "):
            continue
        row = dict(zip(head[1:], cells[1:]))
        row.setdefault("collective", "yes" if "collective" in row.get("ranks", "") else "no")
        row.setdefault("may change", row.pop("what it may do", ""))
        tables[-1] += [(name, row) for name in re.findall(r"``(\w+)", cells[0]) if hasattr(base.ServerAlgorithm, name)]
    found: dict[str, dict[str, str]] = {}
    for table in reversed(tables):
        for name, row in table:
            found.setdefault(name, row)
    return found


def bullets() -> dict[str, str]:
    """{declaration: its text} from the ``- ``name``: text`` bullets of ``fedmpi/algorithms/base.py``'s
    docstring (``- ``a`` / ``b``: text`` describes both)."""
    found: dict[str, str] = {}
    for item in re.split(r"\n- ", (base.__doc__ or "").split("\n\n", 1)[-1]):
        head, _, text = item.partition(":")
        names = re.findall(r"``(\w+)``", head)
        if names and re.fullmatch(r"[`\w\s/,]*", head):
            text = " ".join(text.split("\n\n", 1)[0].split())
            for n in names:
                found.setdefault(n, text.rstrip(";."))
    return found


def hooks() -> list[str]:
    """The public methods of ``ServerAlgorithm`` and its bases that the round calls (not ``HELPERS``)."""
    names = [n for klass in reversed(base.ServerAlgorithm.__mro__) if klass.__module__.startswith("fedmpi")
             for n, v in vars(klass).items() if not n.startswith("_") and callable(getattr(base.ServerAlgorithm, n))
             and not isinstance(v, type)]
    return [n for n in dict.fromkeys(names) if n not in HELPERS and n not in ("Params",)]


def undocumented() -> list[str]:
    """What the page cannot say from the code: hooks without a contract row, declarations without
    a comment (both are the author's to write, where the code is)."""
    missing = [f"{n}: no contract row in fedmpi/algorithms/base.py's docstring" for n in hooks()
               if n not in contracts()]
    notes = notes_of_declarations()
    missing += [f"{n}: no comment where it is declared nor bullet in base.py's docstring" for n in declarations()
                if not notes.get(n)]
    return missing


def notes_of_declarations() -> dict[str, str]:
    """{declaration: what it is}: the docstring's bullet, else the comment where it is declared."""
    notes = {**comments(Stateful), **comments(base.Algorithm), **comments(base.ServerAlgorithm)}
    return {**{k: v for k, v in notes.items() if v}, **bullets()}


def declarations() -> list[str]:
    """The class-level declarations an algorithm may set (attributes of the base classes)."""
    names = []
    for klass in (Stateful, base.Algorithm, base.ServerAlgorithm):
        names += [n for n, v in vars(klass).items() if not n.startswith("_") and not callable(v)
                  and not isinstance(v, (classmethod, staticmethod, property))]
    return list(dict.fromkeys(["Params", *names]))


# ----------------------------------------------------------------------------- writing the page

def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("``", "`")


def _table(head: list[str], rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                     + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows])


def _members(cls: type, names: list[str] | None = None) -> str:
    """A table of ``cls``'s public methods (or ``names``): signature and first docstring paragraph."""
    names = names or [n for n, v in vars(cls).items() if not n.startswith("_") and not isinstance(v, type)
                      and (callable(v) or isinstance(v, (classmethod, staticmethod)))]
    return _table(["method", "what"], [[f"``{signature(getattr(cls, n), n)}``", summary(getattr(cls, n))]
                                       for n in names])


def _fields(cls: type) -> str:
    """A table of a dataclass's fields: type and the comment beside it."""
    notes = comments(cls)
    return _table(["field", "type", "what"], [[f"``{f.name}``", f"``{f.type}``", notes.get(f.name, "")]
                                             for f in dataclasses.fields(cls)])


def _functions(module: Any, names: list[str]) -> str:
    return _table(["function", "what"], [[f"``{module.__name__}.{signature(getattr(module, n))}``",
                                          summary(getattr(module, n))] for n in names])


def page() -> str:
    """The generated reference (the text between the markers)."""
    rules = contracts()
    hook_rows = []
    for n in hooks():
        fn = getattr(base.ServerAlgorithm, n)
        where = next(k.__name__ for k in base.ServerAlgorithm.__mro__ if n in vars(k))
        c = rules[n]
        hook_rows.append([f"``{signature(fn, n)}``", where, c["ranks"], c["collective"], c["may change"], summary(fn)])
    hook_rows.sort(key=lambda row: list(rules).index(re.match(r"``(\w+)", row[0]).group(1)))
    notes = notes_of_declarations()
    decl_rows = []
    for n in declarations():
        owner = next(k for k in base.ServerAlgorithm.__mro__ if n in vars(k))
        value = getattr(base.ServerAlgorithm, n)
        shown = value.__name__ if isinstance(value, type) else repr(value)
        decl_rows.append([f"``{n}``", owner.__name__, f"``{shown}``", notes.get(n, "")])
    attr_rows = [[f"``self.{n}``", what, after] for n, (what, after) in ATTRIBUTES.items()]
    helper_rows = [[f"``{signature(getattr(base.ServerAlgorithm, n), n)}``", summary(getattr(base.ServerAlgorithm, n))]
                   for n in HELPERS]
    sections = [
        "### Algorithm hooks (`ServerAlgorithm`)",
        "Override only what your algorithm changes. \"ranks\", \"collective\" and \"may change\" are the "
        "contract of `fedmpi/algorithms/base.py`'s docstring (a step of the round: its row there).",
        _table(["hook", "defined in", "ranks", "collective", "may change", "what"], hook_rows),
        "### Declarations (class attributes)",
        _table(["attribute", "declared in", "default", "what"], decl_rows),
        "### What an algorithm holds (`ServerAlgorithm.__init__`)",
        "After a resume everything is built again from the config, then the declared state is loaded; "
        "\"after a resume\" says what that gives before the first round of the new process.",
        _table(["attribute", "what", "after a resume"], attr_rows),
        "### Helpers",
        _table(["method", "what"], helper_rows),
        "`Context` (`self.ctx`):",
        _fields(base.Context) + "\n\n" + _members(base.Context, ["m", "spec", "shard", "device", "local"]),
        "### Per-client outputs (`self.outputs`, `ClientOutputs`)",
        summary(base.ClientOutputs) + " " + " ".join((inspect.getdoc(base.ClientOutputs) or "")
                                                      .split("\n\n", 1)[-1].split()),
        _members(base.ClientOutputs, ["at", "sum"]),
        "Per-client quantities (`client_quantities`, `fedmpi.engine.quantities`):",
        _fields(quantities.ClientQuantity),
        _fields(quantities.SampleLosses) + "\n\n" + _members(quantities.SampleLosses,
                                                             ["sample_mean", "step_mean", "first", "rows"]),
        f"Built in: `MEAN_SQUARED_LOSS` (`{quantities.MEAN_SQUARED_LOSS.name}`): "
        f"{quantities.MEAN_SQUARED_LOSS.doc}.",
        "### Reproducible random draws (`fedmpi.rng`)",
        "Draw as fedmpi does: a key from the seed, a purpose of your own and the round, "
        "`k = rng.key(self.cfg.seed, \"my_purpose\", t)`, then one number per client id, "
        "`rng.uniform(k, ids)`: the same numbers on every rank, whatever the order or the subset "
        "asked, after any resume. Never global random state (`np.random`, `torch.manual_seed`).",
        _functions(rng, ["key", "uniform", "integers", "normal", "bits", "below", "generator"]),
        "### Metrics (`fedmpi.metrics`)",
        f"`{signature(metrics.register_metric)}`: {summary(metrics.register_metric)} "
        f"The function gets a `MetricInput` ({summary(MetricInput)}):",
        _fields(MetricInput),
        "### Callbacks",
        f"`fedmpi.registry.CALLBACKS.{signature(CALLBACKS.register, 'register')}` with "
        "`when=`: " + " ".join(line.strip("# ").strip() for line in inspect.getsource(
            __import__("fedmpi.registry", fromlist=["x"])).splitlines()
            if line.startswith("# ") and ("round_" in line or "evaluated" in line)),
        "### Availability kinds (`fedmpi.participation`)",
        f"`{signature(participation.register)}`: {summary(participation.register)} "
        f"The factory gets the kind's params and a `ClientInfo` ({summary(participation.ClientInfo)}) "
        f"and returns a `Participation`: {summary(participation.Participation)}",
        _members(participation.Participation, ["available", "probabilities", "sampling"]),
        _fields(participation.ClientInfo),
        "### Privacy mechanisms (`fedmpi.privacy.mechanism`)",
        f"`{signature(mechanism.register)}`: {summary(mechanism.register)}",
        _members(mechanism.Mechanism),
        "### Models and datasets",
        _functions(__import__("fedmpi.models", fromlist=["x"]), ["register"]) + "\n\n"
        + _functions(datasets, ["register_dataset"]),
        "### Adapter types and stacked rules",
        _functions(__import__("fedmpi.models.adapters", fromlist=["x"]), ["register_adapter", "adapted", "replace"])
        + "\n\n" + _functions(__import__("fedmpi.engine.layers", fromlist=["x"]), ["stacked_rule"]),
    ]
    return "\n\n".join(sections).replace("``", "`")
