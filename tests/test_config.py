"""Config parsing and validation: typed keys, defaults, one-line errors naming the key."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import synthetic_config
from fedmpi import config
from fedmpi.errors import InputError
from fedmpi.results.paths import output_path
from helpers.properties import given, settings, st


def err(data: dict, world_size: int = 1) -> str:
    with pytest.raises(InputError) as e:
        config.from_dict(data, world_size)
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_defaults_are_valid_and_typed():
    cfg = config.from_dict({})
    assert cfg.rounds == 100 and isinstance(cfg.train.lr, float)
    assert output_path(cfg) == "runs/run-fedavg_active-s0.h5"
    assert cfg.algorithm.name == "fedavg_active"


@pytest.mark.parametrize("data, key", [
    ({"rounds": -1}, "rounds: must be >= 0"),
    ({"train": {"lr": "fast"}}, "train.lr: must be a number"),
    ({"train": {"lr": 0}}, "train.lr: must be > 0"),
    ({"bogus": 1}, "bogus: unknown key"),
    ({"task": {"partition": {"kind": "stripes"}}}, "task.partition.kind: must be one of"),
    ({"task": {"clients": 2.5}}, "task.clients: must be an integer"),
    ({"task": {"clients": True}}, "task.clients: must be an integer"),
    ({"availability": {"kind": "stationary", "base": {"lo": 1.5}}}, "availability.base.lo: must be <= 1"),
    ({"availability": {"kind": "stationary", "base": {"values": [0.2, 2.0]}}, "task": {"clients": 2}},
     "availability.base.values: probabilities must be in [0, 1]"),
    ({"availability": {"kind": "cohort", "size": 500}}, "availability.size"),
    ({"task": {"dataset": "quadratic", "model": "scalar", "clients": 2}}, "task.u"),
    ({"task": {"dataset": "quadratic", "model": "scalar", "clients": 2, "u": [1]}}, "task.u: needs one entry"),
    ({"task": {"model": "scalar"}}, "task.model"),
    ({"train": {"augment": ["rotate"]}}, "train.augment"),
    ({"train": {"lr": float("nan")}}, "train.lr: must be a finite number"),
    ({"task": "fmnist"}, "task: must be a mapping"),
    ({"seed": 2**70}, "seed: must be <= 18446744073709551615"),  # torch's generator takes 64 bits
])
def test_bad_values_name_the_key(data, key):
    assert key in err(data)


def test_more_ranks_than_clients():
    assert "task.clients" in err({"task": {"clients": 2}}, world_size=3)


def test_overrides_and_yaml(tmp_path):
    p = tmp_path / "c.yaml"
    p.write_text("name: a\ntrain: {lr: 0.5}\n")
    cfg = config.load(str(p), ["train.lr=0.25", "seed=7", "train.augment=[crop, flip]", "task.root=null"])
    assert cfg.train.lr == 0.25 and cfg.seed == 7 and cfg.train.augment == ["crop", "flip"]
    with pytest.raises(InputError, match="^--set name.x: name is not a section"):
        config.load(str(p), ["name.x=1"])
    with pytest.raises(InputError, match="expected KEY=VALUE"):
        config.load(str(p), ["seed"])


@pytest.mark.parametrize("text, msg", [
    ("train: [1, 2", "malformed YAML"),
    ("- 1\n- 2\n", "top level must be a mapping"),
])
def test_bad_files(tmp_path, text, msg):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(InputError, match=msg):
        config.load(str(p))
    with pytest.raises(InputError, match="config file not found"):
        config.load(str(tmp_path / "missing.yaml"))


def test_resolved_config_round_trips():
    cfg = config.from_dict({"seed": 4, "task": {"clients": 8}})
    again = config.load(None, [f"{k}={v}" for k, v in [("seed", 4), ("task.clients", 8)]])
    assert cfg.to_yaml() == again.to_yaml() and cfg.resume_digest() == again.resume_digest()
    import yaml

    assert config.from_dict(yaml.safe_load(cfg.to_yaml())).to_yaml() == cfg.to_yaml()


def test_reference_lists_every_leaf_key():
    rows = [row for _, row in config.reference()]
    assert any("`train.lr`" in r for r in rows) and any("`sporadicity.link_prob.a`" in r for r in rows)


_scalars = st.one_of(st.none(), st.booleans(), st.integers(-5, 10**6), st.floats(allow_nan=True),
                     st.text(max_size=5), st.lists(st.integers(0, 3), max_size=3))
_keys = st.sampled_from(["rounds", "seed", "eval_every", "train.lr", "train.batch_size", "task.clients",
                         "task.partition.alpha", "availability.kind", "availability.base.values",
                         "algorithm.k", "runtime.timeout_s", "task.model", "nonsense.key"])


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(_keys, _scalars, max_size=4))
def test_random_configs_are_valid_or_one_line_errors(items):
    data: dict = {}
    for dotted, v in items.items():
        config._set_dotted(data, dotted, v)
    try:
        config.from_dict(data)
    except InputError as e:
        assert "\n" not in str(e) and str(e).split(":")[0] in {*items, *[k.rsplit(".", 1)[0] for k in items],
                                                                 "task.clients", "task.u", "task.model",
                                                                 "availability.base.values", "availability.size",
                                                                 "availability.kind"}


def _shipped_configs() -> list[str]:
    import glob
    import os

    from conftest import ROOT

    return sorted(p for p in glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True)
                  if not p.endswith(".sweep.yaml"))  # sweep files (fedmpi sweep) are checked in test_sweep.py


def test_configs_are_shipped():
    assert len(_shipped_configs()) >= 10


@pytest.mark.parametrize("path", _shipped_configs(), ids=lambda p: p.rsplit("configs/", 1)[-1])
def test_every_shipped_config_loads_with_every_algorithm_of_its_family(path):
    """Config files keep working, also with --set algorithm.name=... as their headers suggest
    (keys of the file's own algorithm are then ignored with a notice, not refused). A privacy
    config needs the [privacy] extra: without it that config is skipped, the others still run."""
    import yaml

    from fedmpi.registry import ALGORITHMS

    if (yaml.safe_load(open(path)) or {}).get("privacy"):
        pytest.importorskip("dp_accounting", reason="privacy configs need the [privacy] extra (dp-accounting)")
    cfg = config.load(path)
    family = _family(ALGORITHMS.get(cfg.algorithm.name).obj)
    private = cfg.privacy.mechanism != "none"  # a privacy config: the algorithms privacy applies to
    for entry in ALGORITHMS.entries(builtin_only=True):
        if _family(entry.obj) == family and not (private and not _private(entry)):
            more = ["algorithm.max_echo=4"] if private and entry.name == "fedswe" else []  # its sensitivity
            more += ["algorithm.global_lr=1"] if getattr(entry.obj, "own_server_step", None) else []  # its own step
            assert config.load(path, [f"algorithm.name={entry.name}", *more]).algorithm.name == entry.name


def _family(cls: type) -> str:
    """An algorithm's family: asynchronous (on the clock), centralized rounds, or decentralized."""
    from fedmpi.algorithms import ServerAlgorithm
    from fedmpi.algorithms.asynchronous import AsyncAlgorithm

    return "async" if issubclass(cls, AsyncAlgorithm) else "server" if issubclass(cls, ServerAlgorithm) else "peers"


def _private(entry) -> bool:
    """Whether privacy applies to the algorithm of registry ``entry`` (its declaration)."""
    from fedmpi.privacy.declaration import declaration

    try:
        declaration(entry.obj, entry.name)
    except InputError:
        return False
    return True


def notices(data: dict) -> list[str]:
    """The notices ``config.from_dict(data)`` logs (fedmpi's loggers may not propagate)."""
    import logging

    logger, seen = logging.getLogger("fedmpi.config"), []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: seen.append(record.getMessage())
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        config.from_dict(data)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    return seen


@pytest.mark.parametrize("data, notice", [
    ({"algorithm": {"name": "mifa", "k": 3}}, "algorithm.k: not a parameter of mifa (only of fedswe); ignored"),
    ({"availability": {"kind": "markov", "period": 5}},
     "availability.period: not a parameter of markov (only of staircase, sine, interleaved_sine, periodic_groups); "
     "ignored"),
    ({"topology": {"kind": "ring"}},
     "topology: not used by algorithm fedavg_active (only by dspodfl, dgd, rg, sporadic_sgd, dfedavg); ignored"),
    ({"sporadicity": {"redraw_every": 2}, "algorithm": {"name": "fedswe"}},
     "sporadicity: not used by algorithm fedswe (only by dspodfl, dgd, rg, sporadic_sgd, dfedavg); ignored"),
])
def test_a_key_of_another_component_is_ignored_with_one_notice_in_every_section(data, notice):
    assert notices(data) == [notice]


def test_the_server_learning_rate_is_the_server_algorithms_key():
    """eta_g is ``algorithm.global_lr`` of a centralized algorithm; a decentralized one has no server."""
    assert config.from_dict({"algorithm": {"name": "fedadam", "global_lr": 0.03}}).algorithm.global_lr == 0.03
    assert config.from_dict({"algorithm": {"name": "fedswe", "global_lr": 0.5}}).algorithm.global_lr == 0.5
    said = notices({"algorithm": {"name": "dgd", "global_lr": 0.5}, "topology": {"kind": "ring"}})
    assert len(said) == 1 and said[0].startswith("algorithm.global_lr: not a parameter of dgd (only of fedavg_active")
    assert not hasattr(config.from_dict({}).train, "global_lr")


def test_train_global_lr_is_still_read_as_algorithm_global_lr_with_one_notice(tmp_path):
    old = {"train": {"global_lr": 0.03}, "algorithm": {"name": "fedadam"}}
    assert notices(old) == ["train.global_lr: the server's learning rate is now algorithm.global_lr "
                            "(read as that key)"]
    cfg = config.from_dict(old)
    assert cfg.algorithm.global_lr == 0.03 and cfg == config.from_dict({"algorithm": {"name": "fedadam",
                                                                                      "global_lr": 0.03}})
    assert cfg.resume_digest() == "b2c75dd2989ccde4"  # fedmpi's digest before the move: old checkpoints resume
    assert config.from_dict({"train": {"global_lr": 0.03}, "algorithm": {"global_lr": 0.03}}).algorithm.global_lr \
        == 0.03  # the same value twice is no conflict
    with pytest.raises(InputError, match=r"^train\.global_lr: 0\.5 and algorithm\.global_lr: 0\.03 are both given"):
        config.from_dict({"train": {"global_lr": 0.5}, "algorithm": {"global_lr": 0.03}})
    p = tmp_path / "c.yaml"
    p.write_text("algorithm: {name: fedadam, global_lr: 0.03}\n")
    assert config.load(str(p), ["train.global_lr=0.1"]).algorithm.global_lr == 0.1  # --set overrides the file
    assert config.load(str(p), values={"train.global_lr": 0.2}).algorithm.global_lr == 0.2  # as a sweep cell
    with pytest.raises(InputError, match=r"^algorithm\.global_lr: must be > 0"):
        config.from_dict({"train": {"global_lr": -1}})


def test_the_old_and_the_new_key_on_the_command_line_are_refused_like_in_yaml(tmp_path):
    """#38 item 5: ``--set train.global_lr=0.5 --set algorithm.global_lr=2.0`` ran with one of them
    silently; the same pair in a YAML file is refused."""
    p = tmp_path / "c.yaml"
    p.write_text("algorithm: {name: fedadam}\n")
    with pytest.raises(InputError, match=r"^train\.global_lr: 0\.5 and algorithm\.global_lr: 2\.0 are both given "
                                         r"\(train\.global_lr is the old name of algorithm\.global_lr"):
        config.load(str(p), ["train.global_lr=0.5", "algorithm.global_lr=2.0"])
    with pytest.raises(InputError, match=r"^algorithm\.global_lr: 2\.0 and train\.global_lr: 0\.5 are both given"):
        config.load(str(p), ["algorithm.global_lr=2.0", "train.global_lr=0.5"])
    with pytest.raises(InputError, match=r"^train\.global_lr: 0\.5 and algorithm\.global_lr: 2\.0 are both given"):
        config.load(str(p), ["train.global_lr=0.5"], values={"algorithm.global_lr": 2.0})  # a sweep cell's
    assert config.load(str(p), ["train.global_lr=2", "algorithm.global_lr=2.0"]).algorithm.global_lr == 2.0
    assert config.load(str(p), ["algorithm.global_lr=3", "algorithm.global_lr=2.0"]).algorithm.global_lr == 2.0


def test_config_py_declares_only_the_top_level_keys():
    """Every section's keys are declared by their owners (#23); runtime's are assembled from several."""
    rows = config.reference()
    assert {row.split("`")[1] for owner, row in rows if owner == "fedmpi/config.py"} == \
        {"name", "seed", "rounds", "eval_every", "output"}
    owners = {row.split("`")[1]: owner for owner, row in rows}
    assert owners["runtime.progress"] == "fedmpi/progress.py" and owners["runtime.stop_at.goal"] == "fedmpi/metrics.py"
    assert owners["runtime.checkpoint_every"] == owners["runtime.csv"] == "fedmpi/outputs.py"


def test_a_section_is_read_when_its_owner_is_selected_and_none_otherwise():
    cfg = config.from_dict({"algorithm": {"name": "dgd"}, "topology": {"kind": "ring"}})
    assert cfg.topology.kind == "ring" and cfg.sporadicity == config.SporadicityConfig()
    assert config.from_dict({}).topology is None and config.from_dict({}).sporadicity is None
    assert notices({"topology": None}) == []  # a stored config's null section is no key at all


@pytest.mark.parametrize("data, key", [
    ({"availability": {"kind": "markov", "nope": 1}}, "availability.nope: unknown key"),
    ({"algorithm": {"name": "dgd"}, "topology": {"nope": 1}}, "topology.nope: unknown key"),
])
def test_a_key_no_component_declares_is_an_error(data, key):
    assert key in err(data)


def test_each_availability_kind_has_its_own_parameters():
    from fedmpi.registry import AVAILABILITY

    fields = {e.name: {f.name for f in dataclasses.fields(e.params)} for e in AVAILABILITY.entries(builtin_only=True)}
    assert fields["always"] == {"kind"} and fields["cohort"] == {"kind", "size"}
    assert fields["markov"] == {"kind", "base", "R", "B", "markov_groups"}
    assert fields["trace"] == {"kind", "trace", "trace_format", "schedule", "trace_repeat"}


def test_a_step_draws_parameter_enters_the_resume_digest_only_with_its_draw():
    """Old checkpoints resume: the digest of a run without the draw ignores the draw's parameter."""
    def digest(**train) -> str:
        return config.from_dict(synthetic_config(train={"local_steps": 3, "batch_size": 8, "lr": 0.1, **train}
                                                 )).resume_digest()

    assert digest() == digest(local_steps_sigma=2.0) == digest(local_steps_stop=0.5)
    assert digest(local_steps_draw="lognormal") != digest(local_steps_draw="lognormal", local_steps_sigma=2.0)
    assert digest(local_steps_draw="geometric") != digest(local_steps_draw="geometric", local_steps_stop=0.5)


def test_set_a_section_merges_like_a_sweeps_set(tmp_path):
    """#46 (5): --set privacy={...} replaced the whole section (its other keys back to their
    defaults) while a sweep's set: {privacy: {...}} merged it. Both merge now; {} restores the
    defaults."""
    from conftest import write_config
    from fedmpi.results import sweepfile

    base = synthetic_config(algorithm={"name": "fedavg_active"}, train={"local_steps": 4, "batch_size": 8, "lr": 0.1},
                            privacy={"mechanism": "gaussian", "clip": 1.0, "noise_multiplier": 1.0})
    path = write_config(tmp_path / "c.yaml", base)
    cfg = config.load(path, ["privacy={noise_multiplier: 2.0, delta: 1e-5}", "train={lr: 0.5}"])
    assert (cfg.privacy.mechanism, cfg.privacy.clip, cfg.privacy.noise_multiplier, cfg.privacy.delta) == \
        ("gaussian", 1.0, 2.0, 1e-5)
    assert (cfg.train.lr, cfg.train.local_steps) == (0.5, 4)
    dotted = config.load(path, ["privacy.noise_multiplier=2.0", "privacy.delta=1e-5", "train.lr=0.5"])
    sweep = write_config(tmp_path / "s.sweep.yaml", {"base": "c.yaml", "set": {
        "privacy": {"noise_multiplier": 2.0, "delta": 1e-5}, "train": {"lr": 0.5}}})
    sw = sweepfile.load(sweep)
    cell = sw.config(sw.cells[0])
    cell.output = cfg.output = dotted.output = None  # (a cell names its own file)
    assert cfg.to_dict() == dotted.to_dict() == cell.to_dict()
    assert config.load(path, ["task={partition: {alpha: 0.3}}"]).task.partition.kind == "dirichlet"
    assert config.load(path, ["privacy={}"]).privacy.mechanism == "none"
    with pytest.raises(InputError, match=r"privacy\.nope"):
        config.load(path, ["privacy={nope: 1}"])


def test_the_recorded_output_is_the_file_written(tmp_path):
    """#46 (5): the result file recorded the config's output key, not the --out it was written to."""
    import h5py
    import yaml

    from conftest import write_config
    from fedmpi.cli import main

    cfg = write_config(tmp_path / "c.yaml", synthetic_config(rounds=1, output="runs/{name}-{seed}.h5"))
    assert main(["run", cfg, "--out", str(tmp_path / "elsewhere.h5"), "--quiet"]) == 0
    assert main(["run", cfg, "--quiet"]) == 0
    for path, want in ((tmp_path / "elsewhere.h5", str(tmp_path / "elsewhere.h5")),
                       (tmp_path / "runs" / "synth-3.h5", "runs/synth-3.h5")):
        with h5py.File(path) as f:
            assert yaml.safe_load(f.attrs["config"])["output"] == want
