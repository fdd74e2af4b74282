"""The README is a front page that starts with the two set-up commands; the generated config
reference (docs/CONFIG.md) matches fedmpi/config.py; every cited page exists."""

import os

from conftest import ROOT
from fedmpi.docs import END, REFERENCE, START, config_table


def test_config_reference_is_current():
    text = open(REFERENCE, encoding="utf-8").read()
    block = text.split(START, 1)[1].split(END, 1)[0].strip()
    assert block == config_table(), "run: python -m fedmpi.docs"


def test_readme_starts_with_the_two_commands():
    lines = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read().splitlines()
    cmds = [ln for ln in lines[:8] if ln.startswith("bash ")]
    assert cmds[0].startswith("bash launch/quickstart.sh") and cmds[1].startswith("bash launch/test.sh")
    ci = [ln for ln in open(os.path.join(ROOT, ".ci/run"), encoding="utf-8").read().splitlines()
          if ln.startswith("bash ")]
    assert ci[:2] == ["bash launch/quickstart.sh", "bash launch/test.sh"]  # the same two, in that order


def test_every_markdown_reference_resolves_inside_the_repository():
    """Docstrings, comments and docs cite pages that exist here (docs/ holds the definitions)."""
    import glob
    import re

    files = [p for pattern in ("fedmpi/**/*.py", "tests/**/*.py", "benchmarks/*", "launch/*", "slurm/*",
                               "configs/**/*.yaml", "examples/**/*", "docs/*.md", "README.md")
             for p in glob.glob(os.path.join(ROOT, pattern), recursive=True) if os.path.isfile(p)]
    missing = []
    for path in files:
        text = open(path, encoding="utf-8", errors="replace").read()
        for ref in set(re.findall(r"(?<![\w$/.-])[\w./-]*\w\.md\b", text)):  # not $OUT/x.md
            where = (os.path.join(ROOT, ref), os.path.join(ROOT, "docs", os.path.basename(ref)),
                     os.path.join(os.path.dirname(path), ref))
            if not any(os.path.isfile(w) for w in where):
                missing.append(f"{os.path.relpath(path, ROOT)}: {ref}")
    assert len(files) > 50 and not missing, missing


def test_the_table_of_what_works_with_what_is_current():
    """docs/GUARANTEES.md's tables are generated from the components' declarations."""
    import pytest

    pytest.importorskip("dp_accounting")
    from fedmpi.docs import COMBINATIONS, GUARANTEES, combinations_table

    text = open(GUARANTEES, encoding="utf-8").read()
    block = text.split(COMBINATIONS[0], 1)[1].split(COMBINATIONS[1], 1)[0].strip()
    assert block == combinations_table(), "run: python -m fedmpi.docs"


def test_the_plugin_api_reference_is_current():
    """docs/PLUGINS.md's reference is generated from the code (fedmpi/apidoc.py): a changed
    signature, docstring or contract row makes it stale."""
    from fedmpi import apidoc, plugins
    from fedmpi.docs import PLUGINS

    plugins.load()
    text = open(PLUGINS, encoding="utf-8").read()
    block = text.split(apidoc.MARKERS[0], 1)[1].split(apidoc.MARKERS[1], 1)[0].strip()
    assert block == apidoc.page(), "run: python -m fedmpi.docs"


def test_every_hook_has_a_contract_and_every_declaration_a_description():
    """A public method of ServerAlgorithm is a hook with a row in base.py's contract tables, or a
    helper (apidoc.HELPERS); a class attribute it declares has a docstring bullet or a comment."""
    from fedmpi import apidoc

    assert apidoc.undocumented() == []
    rules = apidoc.contracts()
    assert rules["select"]["ranks"].startswith("every rank") and rules["select"]["collective"] == "no"
    assert rules["server_update"]["ranks"] == "rank 0 only" and rules["finish_round"]["collective"] == "yes"
    assert rules["private_part"]["ranks"] == "rank 0 only"


def test_the_attribute_table_covers_what_an_algorithm_holds():
    """Every attribute a built centralized algorithm holds after a round is in the table of what an
    algorithm holds (with what it is after a resume)."""
    from conftest import synthetic_config
    from fedmpi import apidoc, config
    from fedmpi.build import build_components
    from fedmpi.runtime import World

    algo = build_components(config.from_dict(synthetic_config()), World()).algorithm
    algo.round(0)
    assert set(vars(algo)) <= set(apidoc.ATTRIBUTES), set(vars(algo)) - set(apidoc.ATTRIBUTES)


def test_every_command_and_option_is_documented():
    """docs/INTERFACES.md's command line names every command and every option of fedmpi's parser
    (sweep, table and export in docs/SWEEPS.md), so the contract cannot fall behind the code."""
    import argparse
    import re

    from fedmpi.cli import build_parser

    def options(parser: argparse.ArgumentParser) -> set[tuple[str, ...]]:
        found = set()
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for sp in a.choices.values():
                    found |= options(sp)
            elif a.help != argparse.SUPPRESS and a.option_strings and "--help" not in a.option_strings:
                found.add(tuple(a.option_strings))  # documented in any of its forms (-j or --jobs)
        return found

    interfaces = open(os.path.join(ROOT, "docs", "INTERFACES.md"), encoding="utf-8").read()
    cli = interfaces.split("## Command line", 1)[1].split("\n## ", 1)[0]
    sweeps = open(os.path.join(ROOT, "docs", "SWEEPS.md"), encoding="utf-8").read()
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    assert len(commands) >= 9
    missing = []
    for name, parser in commands.items():
        page = sweeps if name in ("sweep", "table", "export") else cli
        if f"fedmpi {name}" not in page:
            missing.append(f"fedmpi {name}")
        missing += [f"fedmpi {name} {forms[-1]}" for forms in sorted(options(parser))
                    if not any(re.search(re.escape(o) + r"\b", page) for o in forms)]
    assert "--version" in cli and not missing, missing
