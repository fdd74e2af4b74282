"""Keeps the README's generated parts true: ``python -m fedmpi.docs`` rewrites them."""

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


def update_readme(path: str) -> bool:
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
    readme = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "README.md")
    print("updated" if update_readme(readme) else "up to date", readme)
