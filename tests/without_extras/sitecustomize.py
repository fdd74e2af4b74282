"""Run the tests as on a machine without some optional extras (docs/DESIGN.md "Tests"):

    FEDMPI_HIDE=dp_accounting,pandas,scipy,hypothesis,tensorboard,wandb,mlflow PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 \\
        PYTHONPATH=$PWD:$PWD/tests/without_extras python -m pytest -m "not slow"

Python imports this file at start-up when its folder is on PYTHONPATH (so the CLI subprocesses
of the tests, which inherit PYTHONPATH, lose the extras too); importing a package that
FEDMPI_HIDE names then raises ModuleNotFoundError. Pillow cannot be hidden: matplotlib needs it.
Plug-in autoload is off because hypothesis is also a pytest plug-in."""

import os
import sys

# None in sys.modules is Python's own "not installed": import raises ModuleNotFoundError, and
# importlib.util.find_spec (which torch uses to probe for optional packages) answers None.
for _name in filter(None, os.environ.get("FEDMPI_HIDE", "").split(",")):
    sys.modules[_name] = None
