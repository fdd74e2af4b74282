"""Plug-ins that misbehave while loading (issue 24, items 9 and 24): one line, a documented
exit code, never a silent success and never a built-in replaced."""

from __future__ import annotations

import pytest

from conftest import fedmpi, synthetic_config, write_config
from fedmpi.errors import AGREED, InputError, Interrupted, WriteFailed

FORGED = '''
from fedmpi.algorithms import register
from fedmpi.algorithms.fedavg import FedAvgActive


class Forged(FedAvgActive):
    pass


Forged.__module__, Forged.__qualname__ = FedAvgActive.__module__, FedAvgActive.__qualname__
register("fedavg_active")(Forged)
'''


@pytest.mark.slow
@pytest.mark.parametrize("body, code, words", [
    ("import sys\nsys.exit(0)\n", 2, ("plug-in called sys.exit(0)",)),
    ("import sys\nsys.exit('bye')\n", 2, ("sys.exit('bye')",)),
    ("raise KeyboardInterrupt\n", 3, ("interrupted while the plug-in was loading",)),
    (FORGED, 2, ("'fedavg_active' is already registered by fedmpi.algorithms.fedavg", "fedmpi's own")),
])
def test_a_misbehaving_plugin_is_one_line(tmp_path, body, code, words):
    plugin = tmp_path / "bad.py"
    plugin.write_text(body)
    out = tmp_path / "r.h5"
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(output=str(out), rounds=2))
    p = fedmpi(["run", cfg, "--plugin", str(plugin), "--quiet"], check=False)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == code and len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "--plugin" in lines[0] and all(w in lines[0] for w in words), lines[0]
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.mpi
def test_a_plugin_failing_on_one_rank_only_stops_every_rank_with_one_line(tmp_path):
    """A plug-in file missing on another node (#24 item 6): rank 1 failed silently and rank 0 went
    on until the launcher killed it. Now the ranks agree first: exit 2, one line naming rank 1."""
    plugin = tmp_path / "here_only.py"
    plugin.write_text("import os\nif os.environ.get('OMPI_COMM_WORLD_RANK', os.environ.get('PMI_RANK')) == '1':\n"
                      "    raise ImportError('not on this node')\n")
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(output=str(tmp_path / "r.h5"), rounds=2))
    p = fedmpi(["run", cfg, "--plugin", str(plugin), "--quiet"], ranks=2, check=False, timeout=120)
    ours = [ln for ln in p.stderr.splitlines() if ln.startswith("fedmpi")]
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert len(ours) == 1 and ours[0].startswith("fedmpi: error: rank 1: --plugin") and "not on this node" in ours[0]


_ON_RANK_0 = """
import os
from fedmpi.metrics import register_metric
from fedmpi.registry import CALLBACKS

if os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("PMI_RANK")) == "0":
    if "{when}" == "metric":
        register_metric("only_here", lambda m: 1.0)
    else:
        CALLBACKS.register("watch", lambda run, t, *rest: None, when="{when}")
"""


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("when", ["evaluated", "round_start", "metric"])
def test_a_callback_or_metric_registered_on_rank_0_only_is_refused_at_set_up(tmp_path, when):
    """#38 item 8: a callback registered on rank 0 only stalled the job for runtime.timeout_s (300 s),
    then exit 1 ("lost contact with another rank") and a result file left ``running``."""
    plugin = tmp_path / "rank0.py"
    plugin.write_text(_ON_RANK_0.format(when=when))
    out = tmp_path / "r.h5"
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(output=str(out), rounds=2,
                                                             runtime={"timeout_s": 100, "progress": False}))
    p = fedmpi(["run", cfg, "--plugin", str(plugin), "--quiet"], ranks=2, check=False, timeout=90)
    ours = [ln for ln in p.stderr.splitlines() if ln.startswith("fedmpi")]
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert len(ours) == 1 and ours[0].startswith("fedmpi: error: plug-in: ") and \
        "is registered on rank 0 but not on rank 1; callbacks and metrics run on every rank" in ours[0], ours
    assert ("plug-in: metric only_here is" if when == "metric" else "plug-in: callback watch is") in ours[0]
    assert not out.exists()


@pytest.mark.slow
def test_a_plugin_that_would_load_nothing_is_refused(tmp_path):
    """``--plugin json`` (a module imported long before) and a plug-in folder named like an
    imported module (Python hands back that module) loaded nothing, silently (#24 item 24)."""
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(output=str(tmp_path / "r.h5"), rounds=2))
    folder = tmp_path / "plugs" / "json"  # not in the working directory, where Python would find it first
    folder.mkdir(parents=True)
    (folder / "__init__.py").write_text("raise RuntimeError('never imported')\n")
    for spec, words in (("json", "imported before the plug-ins were loaded"),
                        (str(folder), "a module named 'json' is already imported")):
        p = fedmpi(["run", cfg, "--plugin", spec, "--quiet"], check=False)
        lines = p.stderr.strip().splitlines()
        assert p.returncode == 2 and len(lines) == 1 and words in lines[0], p.stderr


class _Failed(InputError):
    """A rank's own kind of set-up error (e.g. a subclass with its own exit code)."""


@pytest.mark.parametrize("errors, me, expect", [
    ([None, None, None], 0, None),
    ([None, "--plugin p: gone", None], 0, (InputError, "rank 1: --plugin p: gone")),  # names the rank
    (["a: bad", "b: bad", None], 0, (InputError, "a: bad")),  # rank 0's own: no prefix
    (["a: bad", "b: bad", None], 2, (InputError, "a: bad")),  # the first failing rank is rank 0
    ([None, "a: bad", _Failed("mine")], 2, (_Failed, "mine")),  # its own error, its own type
    ([Interrupted("signal SIGTERM during set-up"), None], 1,  # a stop signal stops every rank as such
     (Interrupted, "signal SIGTERM during set-up")),
    ([None, Interrupted("signal SIGTERM during set-up")], 0, (Interrupted, "rank 1: signal SIGTERM during set-up")),
    ([WriteFailed("r.h5: cannot write the result file (No space left on device)"), None], 1,  # exit 1 on every rank
     (WriteFailed, "r.h5: cannot write the result file (No space left on device)")),
])
def test_one_agreement_on_errors_before_and_after_the_world(errors, me, expect):
    """``agree_on_error`` serves the launcher (before the world) and the runner's set-up (after):
    every rank raises if any rank failed; a rank's own error keeps its type, the others name the rank."""
    from fedmpi.runner import agree
    from fedmpi.runtime.launcher import agree_on_error

    mine = errors[me] if isinstance(errors[me], Exception) else (InputError(errors[me]) if errors[me] else None)
    errors = [InputError(e) if isinstance(e, str) else e for e in errors]
    said = [None if e is None else (next(i for i, c in enumerate(AGREED) if isinstance(e, c)), str(e)) for e in errors]

    class World:  # the world's allgather, as seen by rank ``me``
        def allgather_obj(self, obj):
            assert obj == said[me]
            return said

    def setup():
        if mine is not None:
            raise mine
        return "ok"

    for call in (lambda: agree_on_error(World().allgather_obj, mine), lambda: agree(World(), setup)):
        if expect is None:
            call()
            continue
        with pytest.raises(expect[0]) as caught:
            call()
        assert str(caught.value) == expect[1] and (type(caught.value) is expect[0])
