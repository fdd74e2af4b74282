"""Readable names for figures and tables: metrics (``test_acc`` -> "test accuracy") and config
keys (``train.lr`` -> "lr"), and a sweep's own ``labels:`` for keys and their values, which win.

A key's default name is the shortest tail of its dotted name that no other key shown beside it
shares (``train.lr`` -> ``lr``, ``algorithm.k`` -> ``k``), and a component's selector is named by
its section (``algorithm.name`` -> ``algorithm``, ``availability.kind`` -> ``availability``). A
value is shown as it is unless the sweep labels it; a key whose value is absent (a key of
another algorithm) is not shown at all, never as ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

_METRICS = {"test_acc": "test accuracy", "test_loss": "test loss", "train_acc": "train accuracy",
            "train_loss": "train loss", "n_active": "active clients", "wall_time": "wall time (s)",
            "peak_rss_mb": "peak memory (MB)", "sim_delay": "emulated delay", "round": "round",
            "consensus_error": "consensus error", "epsilon": "privacy epsilon",
            "epsilon_production": "privacy epsilon of the production cohort",
            "test_ppl": "test perplexity", "train_ppl": "train perplexity"}
_CLIENT_STATS = {"p10": "10th percentile", "p50": "median", "p90": "90th percentile", "std": "std",
                 "worst": "worst clients"}
_SELECTORS = ("name", "kind")


def metric(name: str) -> str:
    """``test_acc`` -> 'test accuracy', ``test_acc_server`` -> 'test accuracy (server)',
    ``client_acc_p10`` -> 'client accuracy (10th percentile)'; unknown names with spaces."""
    if name in _METRICS:
        return _METRICS[name]
    for kind, what in (("acc", "accuracy"), ("loss", "loss"), ("ppl", "perplexity")):
        if name.startswith(f"client_{kind}_") and name[len(kind) + 8:] in _CLIENT_STATS:
            return f"client {what} ({_CLIENT_STATS[name[len(kind) + 8:]]})"
    for base in ("test_acc", "test_loss", "test_ppl", "x"):
        if name.startswith(base + "_"):
            return f"{_METRICS.get(base, base)} ({name[len(base) + 1:].replace('_', ' ')})"
    return name.replace("_", " ")


@dataclass
class KeyLabel:
    """A sweep's label of one key: its name, and names of some of its values."""

    name: str | None = None
    values: dict[Any, str] = field(default_factory=dict)

    def value(self, v: Any) -> str | None:
        """The label of value ``v`` (numbers compare as numbers: 1 and 1.0 are one value)."""
        for known, text in self.values.items():
            if same_value(known, v):
                return text
        return None


def same_value(a: Any, b: Any) -> bool:
    """Whether two config values are one value to a config (1 and 1.0; not true and 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return repr(a) == repr(b)


def key_names(keys: list[str], labels: dict[str, KeyLabel] | None = None) -> dict[str, str]:
    """A readable name for each of ``keys`` shown together: the sweep's label, else the shortest
    tail of the dotted key that none of the others shares (a selector: its section's name)."""
    labels = labels or {}

    def tail(key: str, n: int) -> str:
        parts = key.split(".")
        if len(parts) > 1 and parts[-1] in _SELECTORS:
            parts = parts[:-1]
        return ".".join(parts[-n:])

    out = {}
    for k in keys:
        if labels.get(k) is not None and labels[k].name:
            out[k] = labels[k].name
            continue
        n = 1
        while n < k.count(".") + 1 and any(tail(o, n) == tail(k, n) for o in keys if o != k):
            n += 1
        out[k] = tail(k, n)
    return out


def value_text(key: str, value: Any, labels: dict[str, KeyLabel] | None = None) -> str:
    """A value as shown in a table cell or a legend: the sweep's label of it, else the value."""
    label = (labels or {}).get(key)
    text = label.value(value) if label is not None else None
    if text is not None:
        return text
    return _shown(value)


def _shown(value: Any) -> str:
    """100.0 -> '100' (a float key holds whole numbers too), 0.1 -> '0.1', lists in brackets."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    if isinstance(value, list):
        return "[" + ", ".join(map(_shown, value)) + "]"
    return "-" if value is None else str(value)


def assignment(key: str, value: Any, names: dict[str, str], labels: dict[str, KeyLabel] | None = None) -> str:
    """``lr=0.1`` for a legend, or the value's own label alone when the sweep labels it."""
    label = (labels or {}).get(key)
    if label is not None and label.value(value) is not None:
        return label.value(value)
    return f"{names.get(key, key)}={value_text(key, value)}"
