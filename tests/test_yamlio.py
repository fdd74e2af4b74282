"""The safe YAML/JSON reader: YAML 1.2 numbers, duplicate keys, alias bombs and deep nesting refused."""

from __future__ import annotations

import math

import h5py
import numpy as np
import pytest
import yaml

from conftest import cli, fedmpi, synthetic_config, write_config
from helpers.deadline import deadline
from fedmpi import config, yamlio
from fedmpi.errors import InputError


@pytest.mark.parametrize("text, value", [
    ("1e-3", 0.001), ("5E4", 50000.0), ("-2.5e+2", -250.0), (".5", 0.5), ("1.", 1.0), ("+7", 7),
    ("0x1F", 31), ("0o17", 15), ("017", 17), (".inf", math.inf), ("-.Inf", -math.inf),
    ("1:30", "1:30"), ("yes", "yes"), ("off", "off"), ("2001-12-14", "2001-12-14"), ("1_000", "1_000"),
    ("~", None), ("null", None), ("", None), ("True", True), ("false", False),
    ("'1e-3'", "1e-3"), ("!!float 3", 3.0), ("!!str 3", "3"), ("!!int 0x10", 16),
])
def test_core_schema_scalars(text, value):
    assert yamlio.loads(f"v: {text}", "t")["v"] == value
    assert type(yamlio.loads(f"v: {text}", "t")["v"]) is type(value)


def test_nan_and_structure():
    assert math.isnan(yamlio.loads("v: .nan", "t")["v"])
    assert yamlio.loads("a: [1, {b: 2}]\nc: {}\n", "t") == {"a": [1, {"b": 2}], "c": {}}
    assert yamlio.loads("", "t") is None


def test_config_numbers_and_overrides(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  lr: 1e-3\n  batch_size: 5E1\n")
    cfg = config.load(str(p), ["algorithm.global_lr=2E-1", "seed=0x10"])
    assert cfg.train.lr == 0.001 and cfg.train.batch_size == 50 and cfg.algorithm.global_lr == 0.2 and cfg.seed == 16
    p.write_text("train:\n  lr: 1:30\n")
    with pytest.raises(InputError, match=r"^train\.lr: must be a number, got '1:30'$"):
        config.load(str(p))


def test_duplicate_keys_name_the_key(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("train:\n  lr: 0.1\n  batch_size: 4\n  lr: 0.2\n")
    with pytest.raises(InputError) as e:
        config.load(str(p))
    assert str(e.value) == f"{p}: duplicate key train.lr (lines 2 and 4)"
    with pytest.raises(InputError, match=r"duplicate key a\.b\[1\]\.c"):
        yamlio.loads("a: {b: [1, {c: 2, c: 3}]}", "t")
    with pytest.raises(InputError, match="duplicate key 'x'"):
        yamlio.loads_json('{"x": 1, "x": 2}', "t")


def test_merge_keys_and_aliases():
    doc = yamlio.loads("base: &b {lr: 0.1, batch_size: 8}\ntrain:\n  <<: *b\n  lr: 0.5\nrows: [&r [1, 2], *r]\n", "t")
    assert doc["train"] == {"lr": 0.5, "batch_size": 8} and doc["rows"] == [[1, 2], [1, 2]]
    for bad, msg in (("- &a [*a]", "inside the collection it names"), ("a: *nope", "undefined alias"),
                     ("a: {<<: 3}", "merge key"), ("? [1]\n: 2\n", "must be a scalar"),
                     ("a: 1\n---\nb: 2\n", "second YAML document")):
        with pytest.raises(InputError, match=msg):
            yamlio.loads(bad, "t")


@pytest.mark.parametrize("text", ["a: !!python/object/apply:os.system [echo hi]", "a: !!set {x}",
                                  "a: !custom 1", "a: !!binary aGk=", "a: !!int x"])
def test_foreign_tags_refused(text):
    with pytest.raises(InputError, match=r"^t: .*(unsupported tag|not a valid)"):
        yamlio.loads(text, "t")


def _bomb(levels: int, width: int = 9) -> str:
    """A flow list of ``levels`` anchored lists, each ``width`` aliases of the previous one."""
    rows = [f"&l0 [{', '.join(['0'] * width)}]"]
    rows += [f"&l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, levels)]
    return "[" + ", ".join(rows) + "]"


def test_alias_budget():
    yamlio.loads(_bomb(6), "t")  # 9 + 81 + ... + 9^6 = 597870 expanded values: within the budget
    with pytest.raises(InputError, match=r"^t: more than 1000000 values once aliases are expanded \(at \[6\]"):
        yamlio.loads(_bomb(7), "t")


def test_alias_bomb_in_schedule_is_refused_at_once(tmp_path):
    """The campaign's ~700-byte bomb (10 levels of anchors) in availability.schedule ran for minutes."""
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=2, availability={"kind": "trace"}))
    text = open(cfg).read().replace("availability:\n", f"availability:\n  schedule: {_bomb(10)}\n", 1)
    open(cfg, "w").write(text)
    assert len(text) < 1500
    with deadline(60):
        p = cli(["run", cfg, "--out", str(tmp_path / "r.h5")])
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().startswith(f"fedmpi: error: {cfg}: more than 1000000 values once aliases are "
                                       f"expanded (at availability.schedule[6]")
    assert len(p.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_aliases_within_budget_run(tmp_path):
    text = yaml.safe_dump(synthetic_config(rounds=3, availability={"kind": "trace"},
                                           runtime={"log_availability": True}))
    text = text.replace("availability:\n", "availability:\n  schedule: [&r [0, 1], *r, [5]]\n", 1)
    (tmp_path / "c.yaml").write_text(text)
    fedmpi(["run", str(tmp_path / "c.yaml"), "--out", str(tmp_path / "r.h5"), "--quiet"])
    with h5py.File(tmp_path / "r.h5", "r") as f:
        assert [np.flatnonzero(r).tolist() for r in f["availability/mask"][:]] == [[0, 1], [0, 1], [5]]


def test_deep_nesting_is_one_line(tmp_path):
    """Deeply nested YAML ended in a RecursionError with ~3000 lines of traceback."""
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=1, availability={"kind": "trace"}))
    text = open(cfg).read().replace("availability:\n", "availability:\n  schedule: " + "[" * 5000 + "]" * 5000
                                    + "\n", 1)
    open(cfg, "w").write(text)
    with deadline(60):
        p = cli(["run", cfg, "--out", str(tmp_path / "r.h5")])
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert "nested deeper than 64 levels (at availability.schedule[0][0]" in p.stderr


def test_json_depth_is_counted_before_parsing():
    assert yamlio.json_depth(b'{"a": [1, {"b": "[[[[{{"}]}') == 3
    with pytest.raises(InputError, match=r"^x\.json: JSON nested 100000 levels deep, more than the 64 allowed$"):
        yamlio.loads_json(b"[" * 100000 + b"]" * 100000, "x.json")
    with pytest.raises(InputError, match=r"^x\.json: malformed JSON"):
        yamlio.loads_json(b'{"a": ', "x.json")


def test_files_too_big_or_missing(tmp_path):
    p = tmp_path / "big.yaml"
    with open(p, "wb") as fh:
        fh.truncate(yamlio.MAX_FILE_BYTES + 1)
    with pytest.raises(InputError, match="larger than the 64 MiB allowed"):
        yamlio.load_file(str(p))
    with pytest.raises(InputError, match="nope.yaml: config file not found"):
        config.load(str(tmp_path / "nope.yaml"))
    with pytest.raises(InputError, match="too long"):
        yamlio.loads("a: " + "9" * 5000, "t")


def test_a_parser_that_stops_deep_nesting_itself_still_gets_fedmpis_message(monkeypatch):
    """#38: PyYAML 6.0.4's libyaml stops deep flow nesting while it scans ahead, before the builder
    sees an event ("malformed YAML at line 2 (exceeded maximum nesting depth)", no key path). A
    document that libyaml refuses is parsed again by the pure-Python parser, so fedmpi's own check
    names the key path with any PyYAML."""

    class Strict(yaml.SafeLoader):  # libyaml 6.0.4 as seen from Python
        def check_event(self, *choices):
            if "[" * 1000 in self.buffer:
                raise yaml.scanner.ScannerError(None, None, "exceeded maximum nesting depth", self.get_mark())
            return super().check_event(*choices)

    monkeypatch.setattr(yamlio, "_Loader", Strict)
    with pytest.raises(InputError, match=r"^c\.yaml: nested deeper than 64 levels \(at a\.b\[0\]\[0\]"):
        yamlio.loads("a:\n  b: " + "[" * 5000 + "]" * 5000 + "\n", "c.yaml")
    with pytest.raises(InputError, match=r"^c\.yaml: malformed YAML at line 2"):  # a genuine error stays one
        yamlio.loads("a: [1, 2\n", "c.yaml")
    assert yamlio.loads("a: [[1]]\n", "c.yaml") == {"a": [[1]]}
