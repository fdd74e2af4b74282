"""Keeps the generated config reference (docs/CONFIG.md) true: ``python -m fedmpi.docs`` rewrites it."""

from __future__ import annotations

import os
import re

from .config import reference

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def config_table() -> str:
    """The config reference: one table per file that declares keys, in the order of the keys."""
    groups: dict[str, list[str]] = {}
    for owner, row in reference():
        groups.setdefault(owner, []).append(row)
    return "\n\n".join("\n".join([f"Declared in `{owner}`:", "", "| key | default | allowed | meaning |",
                                   "|---|---|---|---|", *rows]) for owner, rows in groups.items())


REFERENCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "CONFIG.md")


def update_reference(path: str = REFERENCE) -> bool:
    """Rewrite the config reference between the markers; True when the file changed."""
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    new = re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: f"{START}\n{config_table()}\n{END}",
                 text, flags=re.S)
    if new != text:
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(new)
    return new != text


if __name__ == "__main__":
    print("updated" if update_reference() else "up to date", REFERENCE)
