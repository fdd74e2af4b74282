"""Loading the components: the one loader, and the one door through which plug-ins come in.

``load`` imports the built-in components (each module registers its own into
``fedmpi.registry``), then the plug-ins; the command line (every command takes ``--plugin``),
a sweep's cells (``results/sweepfile.py``) and ``fedmpi.config.load``/``from_dict`` call it.
Imports go one way: this module imports the components, the components import
``fedmpi.registry``, and the registry imports neither.

A plug-in is a Python module (or package) that registers components when imported, e.g. an
algorithm with ``@fedmpi.algorithms.register("fedavgm")``. It is loaded on every rank, before
the config is validated, from three sources, in this order:

1. the entry-point group ``fedmpi.plugins`` of installed packages
   (``[options.entry_points] fedmpi.plugins = mine = mypkg.fedmpi_plugin``);
2. ``$FEDMPI_PLUGINS``: paths or module names separated by ``:`` (``os.pathsep``);
3. ``--plugin PATH_OR_MODULE`` of any command (repeatable), and a sweep file's ``plugins:``
   (relative to the sweep file).

A spec is a ``.py`` file, a package folder (with ``__init__.py``) or an importable module name.
Each is imported once per process; any failure is an ``InputError`` naming the plug-in.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import os
import sys
import traceback
from types import ModuleType
from typing import Callable, Iterable

from . import provenance
from .errors import InputError, Interrupted
from .inputs import check_regular

ENV = "FEDMPI_PLUGINS"
GROUP = "fedmpi.plugins"

_done: set[str] = set()
_modules: set[str] = set()  # names of the modules loaded as plug-ins


def load(specs: Iterable[str] = ()) -> None:
    """Import the built-ins, then the installed plug-ins and ``$FEDMPI_PLUGINS`` (each once),
    then ``specs`` (``--plugin``). Every rank calls it, before its config is validated."""
    _builtins()  # first: a plug-in may not take a built-in's name
    for ep in _entry_points():
        _once(f"entry point {ep.value}", f"entry point {ep.name} ({ep.value})", ep.load)
    for spec in filter(None, os.environ.get(ENV, "").split(os.pathsep)):
        _once(spec, f"{ENV}: {spec}", lambda spec=spec: import_spec(spec))
    for spec in specs:
        _once(spec, f"--plugin {spec}", lambda spec=spec: import_spec(spec))


def _builtins() -> None:
    """Import the modules that register the built-in components (each once per process)."""
    from . import algorithms, models, participation  # noqa: F401  (each package registers its own)
    from .data import datasets  # noqa: F401
    from . import task  # noqa: F401  (quadratic)


@functools.cache
def _entry_points() -> list:
    """The installed plug-ins, read once per process (scanning every distribution's metadata took
    12 ms, and every config load asks)."""
    try:
        return list(importlib.metadata.entry_points(group=GROUP))
    except Exception:  # a broken installed distribution must not stop fedmpi
        return []


def _once(key: str, what: str, do: Callable[[], object]) -> None:
    """Run ``do`` unless ``key`` was loaded before; errors name ``what``."""
    if key in _done:
        return
    try:
        loaded = do()
    except InputError as e:
        raise InputError(f"{what}: {e}") from None
    except SystemExit as e:  # would end the command with no word, and code 0 would look like success
        raise InputError(f"{what}: plug-in called sys.exit({e.code!r}) while loading") from None
    except KeyboardInterrupt:
        raise Interrupted(f"{what}: interrupted while the plug-in was loading") from None
    except Interrupted:  # a stop signal while it loaded (``signals.interruptible``)
        raise
    except Exception as e:  # the plug-in's own error: one line, with where it happened
        frames = traceback.extract_tb(e.__traceback__)
        where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
        text = " ".join(str(e).split()) or type(e).__name__
        raise InputError(f"{what}: plug-in failed to load ({type(e).__name__}: {text}{where})") from None
    _done.add(key)
    module = _module_of(loaded)
    if module is not None:
        _modules.add(module.__name__)
    provenance.note_plugin(key, getattr(module, "__file__", None))


def _module_of(loaded: object) -> ModuleType | None:
    """The module a loaded plug-in (a module, or what an entry point names) was defined in."""
    return loaded if isinstance(loaded, ModuleType) else sys.modules.get(getattr(loaded, "__module__", ""))


def import_spec(spec: str) -> ModuleType:
    """Import a plug-in given as a file, a package folder or a module name."""
    path = os.path.abspath(os.path.expanduser(spec))
    if spec.endswith(".py") or os.sep in spec or os.path.exists(path):
        if os.path.isdir(path):
            if not os.path.isfile(os.path.join(path, "__init__.py")):
                raise InputError(f"{spec}: a plug-in folder must be a package (with __init__.py)")
            parent, name = os.path.split(path.rstrip(os.sep))
            if parent not in sys.path:
                sys.path.insert(0, parent)
            module = importlib.import_module(name)
            where = os.path.dirname(os.path.abspath(getattr(module, "__file__", None) or ""))
            if where != os.path.abspath(path):  # the name was taken: Python gave back the other module
                raise InputError(f"{spec}: a module named {name!r} is already imported (from {where or 'built-in'}); "
                                 f"rename the plug-in folder")
            return module
        if not os.path.exists(path):
            raise InputError(f"{spec}: no such plug-in file or folder")
        check_regular(path, "plug-in (a .py file or a package folder)")
        return _import_file(path)
    if spec in sys.modules and spec not in _modules:  # e.g. --plugin json: imported long ago, registers nothing
        raise InputError(f"{spec}: this module was imported before the plug-ins were loaded (from "
                         f"{getattr(sys.modules[spec], '__file__', None) or 'built-in'}), so it is no plug-in; "
                         f"name your plug-in by its file or folder")
    try:
        return importlib.import_module(spec)
    except ModuleNotFoundError as e:
        if e.name and spec.startswith(e.name):  # the module itself, not one it imports
            raise InputError(f"{spec}: no such plug-in module (not a file, folder or importable module)") from None
        raise


def _import_file(path: str) -> ModuleType:
    """A single-file plug-in, under a name fixed by its path (so loading it twice is a no-op)."""
    stem = os.path.splitext(os.path.basename(path))[0]
    name = f"fedmpi_plugin_{stem}_{hashlib.sha256(path.encode()).hexdigest()[:8]}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise InputError(f"{path}: cannot be imported as a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses resolve their annotations through sys.modules
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module
