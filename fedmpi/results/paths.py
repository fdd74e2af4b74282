"""Result file names made from config values: ``{dotted.key}`` placeholders and ``key=value`` parts.

Both the ``output`` key (``runs/{name}-{algorithm.name}-s{seed}.h5``) and the per-cell paths of
a sweep (``fedswe_k100/seed=0.h5``) use :func:`value_text`, so a value is spelled the same way
everywhere and only file-name-safe characters reach the file system.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import InputError

_UNSAFE = re.compile(r"[^A-Za-z0-9._+=,-]")
_PLACEHOLDER = re.compile(r"\{([^{}]*)\}")


def value_text(value: Any) -> str:
    """A config value as a short, file-name-safe word: 0.1, 1e-05, true, null, [1,2] -> _1,2_,
    '..' -> '__'."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    elif isinstance(value, float):
        text = repr(value)
    elif isinstance(value, (list, tuple)):
        text = "[" + ",".join(value_text(v) for v in value) + "]"
    elif isinstance(value, dict):
        text = "{" + ",".join(f"{k}={value_text(v)}" for k, v in value.items()) + "}"
    else:
        text = str(value)
    text = _UNSAFE.sub("_", text)
    return "_" * len(text) if text.strip(".") == "" else text  # never '', '.' or '..' (a folder)


def lookup(tree: dict, dotted: str) -> Any:
    """The value at ``dotted`` in a nested dict; KeyError when a part is missing."""
    cur: Any = tree
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise KeyError(dotted)
        cur = cur[part]
    return cur


def fill_placeholders(template: str, tree: dict, key: str) -> str:
    """``template`` with every ``{dotted.key}`` replaced by that config value (``key`` names the
    setting in error messages)."""
    def one(m: re.Match) -> str:
        try:
            return value_text(lookup(tree, m.group(1)))
        except KeyError:
            raise InputError(f"{key}: unknown config key {{{m.group(1)}}} in {template!r}") from None
    return _PLACEHOLDER.sub(one, template)


def assignments(values: dict[str, Any]) -> str:
    """``{"algorithm.k": 0, "seed": 1}`` -> ``algorithm.k=0,seed=1`` (file-name safe)."""
    return ",".join(f"{value_text(k)}={value_text(v)}" for k, v in values.items())


DEFAULT_OUTPUT = "runs/{name}-{algorithm.name}-s{seed}.h5"


def output_path(cfg: Any) -> str:
    """The result file of a config: its ``output`` (or ``DEFAULT_OUTPUT``) with the
    ``{dotted.key}`` placeholders filled in from the config's values."""
    if cfg.output is not None and not cfg.output.strip():
        raise InputError("output: empty result path (give a file name, or null for the default)")
    return fill_placeholders(cfg.output or DEFAULT_OUTPUT, cfg.to_dict(), "output")
