"""Whether this checkout is installed and unchanged since (launch/quickstart.sh then skips
launch/install.sh, which reinstalls fedmpi with pip every time: most of a quickstart rerun).

    python launch/installed.py check mpi,data    # exit 0: installed here, unchanged; 1: install
    python launch/installed.py record mpi,data   # after launch/install.sh succeeded

"Installed and unchanged": this Python's fedmpi is an editable install of this checkout, every
requirement of it and of the extras is installed, and neither the packaging files (setup.cfg,
pyproject.toml) nor launch/install.sh changed since the install recorded (the stamp, in the
install's own fedmpi.egg-info folder, for this Python and these extras). Python files need no
reinstall: the install is editable. Reads package metadata only (no torch import: milliseconds).
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import json
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WATCHED = ("setup.cfg", "pyproject.toml", "launch/install.sh")
STAMP = os.path.join("fedmpi.egg-info", "install-stamp.json")


def stamp(root: str, extras: str) -> dict:
    """What the install depends on: this Python, the extras, the packaging files' digests."""
    files = {}
    for name in WATCHED:
        path = os.path.join(root, name)
        files[name] = hashlib.sha256(open(path, "rb").read()).hexdigest() if os.path.isfile(path) else None
    return {"python": os.path.realpath(sys.executable), "extras": sorted(filter(None, extras.split(","))),
            "files": files}


def _installed_here(root: str, path: list[str] | None) -> metadata.Distribution | None:
    """This Python's fedmpi when it is an editable install of ``root``, else None."""
    dist = next(iter(metadata.distributions(name="fedmpi", path=path) if path is not None
                     else metadata.distributions(name="fedmpi")), None)
    if dist is None:
        return None
    try:
        where = json.loads(dist.read_text("direct_url.json") or "{}")
    except ValueError:
        return None
    url = str(where.get("url", ""))
    editable = bool(where.get("dir_info", {}).get("editable"))
    here = url.startswith("file://") and os.path.realpath(url[len("file://"):]) == os.path.realpath(root)
    return dist if editable and here else None


def _requirements_met(dist: metadata.Distribution, extras: list[str]) -> bool:
    """Every requirement without an extra, or of one of ``extras``, is installed (by name)."""
    for req in dist.requires or []:
        name, _, marker = req.partition(";")
        wanted = re.findall(r"extra\s*==\s*['\"]([^'\"]+)['\"]", marker)
        if wanted and not set(wanted) & set(extras):
            continue
        if "extra" not in marker and marker.strip():  # another marker (a platform's): left to pip
            continue
        package = re.split(r"[\s<>=!~\[(]", name.strip(), maxsplit=1)[0]
        try:
            metadata.version(package)
        except metadata.PackageNotFoundError:
            return False
    return True


def check(root: str, extras: str, path: list[str] | None = None) -> bool:
    """Whether ``root`` is installed for this Python with ``extras`` and unchanged since."""
    try:
        recorded = json.load(open(os.path.join(root, STAMP)))
    except (OSError, ValueError):
        return False
    dist = _installed_here(root, path)
    return (recorded == stamp(root, extras) and dist is not None
            and _requirements_met(dist, stamp(root, extras)["extras"]))


def record(root: str, extras: str) -> None:
    """Keep the stamp of a finished install (in its fedmpi.egg-info; nothing when there is none)."""
    if os.path.isdir(os.path.dirname(os.path.join(root, STAMP))):
        with open(os.path.join(root, STAMP), "w") as f:
            json.dump(stamp(root, extras), f)


if __name__ == "__main__":
    what, extras = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else ""
    if what == "check":
        sys.exit(0 if check(ROOT, extras) else 1)
    record(ROOT, extras)
