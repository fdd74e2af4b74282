"""Run the tests as on a machine without some optional extras (docs/DESIGN.md "Tests"):

    FEDMPI_HIDE=dp_accounting,pandas,scipy,hypothesis,tensorboard PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 \\
        PYTHONPATH=$PWD:$PWD/tests/without_extras python -m pytest -m "not slow"

Python imports this file at start-up when its folder is on PYTHONPATH (so the CLI subprocesses
of the tests, which inherit PYTHONPATH, lose the extras too); importing a package that
FEDMPI_HIDE names then raises ModuleNotFoundError. Pillow cannot be hidden: matplotlib needs it.
Plug-in autoload is off because hypothesis is also a pytest plug-in."""

import os
import sys

_HIDDEN = frozenset(filter(None, os.environ.get("FEDMPI_HIDE", "").split(",")))


class _Hide:
    @staticmethod
    def find_spec(name: str, path=None, target=None):
        if name.split(".")[0] in _HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r} (hidden by FEDMPI_HIDE)", name=name)
        return None


if _HIDDEN:
    sys.meta_path.insert(0, _Hide())
