"""Per-client local step counts (``fedmpi.engine.steps``): every ``train.local_steps_draw``
against its definition over many clients, independence from which clients (ranks) ask, the
uniform draw's bits as before the module existed, errors, and 1 == 2 ranks through the CLI."""

from __future__ import annotations

import math
import typing
import warnings

import h5py
import numpy as np
import pytest
import torch

from conftest import cli, fedmpi, synthetic_config, write_config
from fedmpi import config, guards
from fedmpi.build import build_components, build_task
from fedmpi.engine.local import LocalTrainer
from fedmpi.engine.local_step import TrainConfig
from fedmpi.engine.steps import DRAWS, StepCounts
from fedmpi.errors import InputError
from fedmpi.runtime import World

M = 200_000  # clients: a mean of counts <= 10 is then known to about 0.01


def counts(draw: str, m: int = M, seed: int = 5, sizes: np.ndarray | None = None, **train) -> StepCounts:
    cfg = TrainConfig(local_steps_draw=draw, **train)
    return StepCounts(cfg, np.full(m, 40) if sizes is None else sizes, seed)


def tail(steps: np.ndarray, c: int) -> np.ndarray:
    """Empirical P(steps >= k) for k = 1..c."""
    return np.array([(steps >= k).mean() for k in range(1, c + 1)])


def normal_sf(x: float) -> float:
    return 0.5 * math.erfc(x / math.sqrt(2))


def test_the_draws_are_the_config_choices():
    assert typing.get_args(typing.get_type_hints(TrainConfig)["local_steps_draw"]) == DRAWS


def test_uniform_keeps_its_bits():
    """Counts pinned before the draws moved to engine.steps (LocalTrainer.steps_of delegates)."""
    cfg = config.from_dict(synthetic_config(train__local_steps=7, train__local_steps_draw="uniform"))
    task = build_task(cfg, torch.device("cpu"))
    tr = LocalTrainer(task, cfg.train, cfg.seed, path="batched")
    ids = np.arange(12)
    assert [tr.steps_of(ids, t).tolist() for t in (0, 1, 9)] == [[6, 3, 4, 3, 7, 3, 4, 5, 5, 2, 1, 4],
                                                                  [2, 7, 5, 6, 5, 2, 4, 4, 4, 1, 5, 5],
                                                                  [4, 1, 5, 5, 2, 5, 2, 2, 2, 3, 3, 3]]
    epochs = config.from_dict(synthetic_config(train__local_epochs=1.5, train__local_steps_draw="uniform"))
    assert StepCounts(epochs.train, task.sizes, epochs.seed).of(ids, 4).tolist() == \
        [7, 3, 9, 15, 19, 16, 18, 16, 18, 8, 2, 9]


def test_uniform_matches_its_definition():
    c, ids = 6, np.arange(M)
    steps = counts("uniform", local_steps=c).of(ids, 3)
    assert np.allclose(np.bincount(steps, minlength=c + 1)[1:] / M, 1 / c, atol=0.005)
    assert steps.mean() == pytest.approx((c + 1) / 2, abs=0.02)


@pytest.mark.parametrize("q", [0.1, 0.3])
def test_geometric_matches_its_definition(q):
    c, ids = 8, np.arange(M)
    sc = counts("geometric", local_steps=c, local_steps_stop=q)
    steps = sc.of(ids, 2)
    assert np.allclose(tail(steps, c), (1 - q) ** np.arange(c), atol=0.005)  # P(>= k) = (1-q)^(k-1)
    assert steps.mean() == pytest.approx((1 - (1 - q) ** c) / q, abs=0.02)
    assert not np.array_equal(steps, sc.of(ids, 3))  # a fresh draw every round


@pytest.mark.parametrize("sigma", [0.3, 1.0])
def test_lognormal_matches_its_definition(sigma):
    c, ids = 10, np.arange(M)
    sc = counts("lognormal", local_steps=c, local_steps_sigma=sigma)
    steps = sc.of(ids, 0)
    # floor(exp(sigma z) c) >= k  <=>  z >= ln(k / c) / sigma
    want = np.array([1.0] + [normal_sf(math.log(k / c) / sigma) for k in range(2, c + 1)])
    assert np.allclose(tail(steps, c), want, atol=0.005)
    assert steps.mean() == pytest.approx(want.sum(), abs=0.02)
    assert np.array_equal(steps, sc.of(ids, 7))  # a device's speed is drawn once
    assert not np.array_equal(steps, counts("lognormal", seed=6, local_steps=c, local_steps_sigma=sigma).of(ids, 0))


@pytest.mark.parametrize("draw", DRAWS)
def test_every_draw_stays_in_1_to_the_nominal_count(draw):
    """Nominal counts from local_epochs differ by client; extreme parameters do not leave 1..c_i."""
    sizes = np.random.default_rng(0).integers(1, 200, 5000)
    nominal = counts("fixed", sizes=sizes, local_epochs=1.0, batch_size=10).of(np.arange(5000), 0)
    assert nominal.tolist() == np.maximum(np.ceil(sizes / 10), 1).astype(int).tolist()
    for extreme in ({}, {"local_steps_stop": 1e-12, "local_steps_sigma": 1e3},
                    {"local_steps_stop": 1 - 1e-12, "local_steps_sigma": 1e-9}):
        steps = counts(draw, sizes=sizes, local_epochs=1.0, batch_size=10, **extreme).of(np.arange(5000), 1)
        assert steps.dtype == np.int64 and (steps >= 1).all() and (steps <= nominal).all()


@pytest.mark.parametrize("draw", DRAWS)
def test_counts_do_not_depend_on_who_asks(draw):
    """Any subset of clients in any order (a rank's shard, a block) gets the same counts."""
    ids = np.arange(3000)
    ref = counts(draw, m=3000, local_steps=9).of(ids, 4)
    some = np.random.default_rng(1).permutation(3000)[:700]
    assert np.array_equal(counts(draw, m=3000, local_steps=9).of(some, 4), ref[some])
    assert np.array_equal(counts(draw, m=3000, local_steps=9).of(some[::-1].copy(), 4), ref[some[::-1]])


@pytest.mark.parametrize("key, value", [("local_steps_draw", "poisson"), ("local_steps_stop", 1.0),
                                        ("local_steps_stop", 0), ("local_steps_sigma", -0.5)])
def test_bad_values_name_the_key(key, value):
    with pytest.raises(InputError, match=f"train.{key}"):
        config.from_dict(synthetic_config(**{f"train__{key}": value}))


def test_bad_draw_exits_2_on_the_cli(tmp_path):
    cfg = write_config(tmp_path / "c.yaml", synthetic_config())
    p = cli(["run", cfg, "--quiet", "--set", "train.local_steps_draw=poisson"])
    assert p.returncode == 2 and "train.local_steps_draw" in p.stderr and "lognormal" in p.stderr


@pytest.mark.parametrize("train, text, needle", [
    ({"local_epochs": 1e300}, None, r"^train\.local_epochs: 1e\+300 epochs of client \d+'s \d+ samples at batch_size 8 "
                                     r"are [0-9.e+]+ local steps per round, more than the 2147483647 allowed$"),
    ({"local_epochs": 1e308}, None, r"^train\.local_epochs: .* are inf local steps per round"),
    ({}, b"1 " * 11 + b"100000000000000000000000", r"^train\.local_steps_file: .*client 11's count "
                                                    r"100000000000000000000000 is outside 1\.\.2147483647, the local"),
    ({}, b"1 2 \x00\xff\xfe 3" * 4, r"^train\.local_steps_file: .* must hold integers only \(byte 5 is not text\)"),
    ({}, b"1 2 3e4" + b" 1" * 9, r"^train\.local_steps_file: .* must hold integers only, got '3e4'"),
])
def test_huge_or_binary_step_counts_are_one_line(tmp_path, train, text, needle):
    """#38 item 13: local_epochs 1e300 and a steps file holding 10^23 or binary bytes gave
    tracebacks (OverflowError, UnicodeDecodeError) and leaked numpy's cast warnings."""
    if text is not None:
        (tmp_path / "steps.txt").write_bytes(text)
        train = {"local_steps_file": str(tmp_path / "steps.txt")}
    cfg = config.from_dict(synthetic_config(**{f"train__{k}": v for k, v in train.items()}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(InputError, match=needle):
            build_components(cfg, World())


def test_more_step_inputs_than_memory_are_refused_up_front(tmp_path, monkeypatch):
    """A block's minibatch ids are drawn for all of a round's steps at once: local_steps: 10^8 tried
    to allocate ~300 GB in the first round; local_epochs 10^12 ran a round for ever."""
    for key, value in (("local_steps", 10**8), ("local_epochs", 10**6)):
        cfg = config.from_dict(synthetic_config(**{f"train__{key}": value}))
        with pytest.raises(InputError, match=rf"^train\.{key}: \d+ local steps of a block of 12 clients x 8 samples "
                                             r"need [0-9.]+ GiB of minibatch ids, more than half the"):
            build_components(cfg, World())
    assert guards.step_inputs_bytes(10, 4, 8, False, False) == 10 * 4 * (9 + 8 * 32)
    assert guards.step_inputs_bytes(10, 4, 8, True, True) == 10 * 4 * (9 + 8 * 12) + 4 * 8 * 32


def test_more_step_inputs_than_memory_is_one_line_on_the_cli(tmp_path):
    p = cli(["run", write_config(tmp_path / "c.yaml", synthetic_config()), "--quiet", "--set",
             "train.local_steps=100000000"])
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "train.local_steps: 100000000 local steps" in p.stderr


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("draw", ["geometric", "lognormal"])
def test_one_and_two_ranks_give_the_same_bits(draw, tmp_path):
    """FedNova weights clients by their step counts, so a count that differed by rank would show."""
    cfg = write_config(tmp_path / "c.yaml", synthetic_config(
        algorithm={"name": "fednova"}, train__local_epochs=0.3, train__local_steps_draw=draw,
        train__local_steps_stop=0.3, train__local_steps_sigma=0.8))
    outs = [str(tmp_path / f"r{ranks}.h5") for ranks in (0, 2)]
    for ranks, out in zip((0, 2), outs):
        fedmpi(["run", cfg, "--quiet", "--out", out], ranks=ranks)
    with h5py.File(outs[0]) as a, h5py.File(outs[1]) as b:
        for k in ("final/params", "metrics/test_loss", "metrics/train_loss"):
            np.testing.assert_array_equal(a[k][:], b[k][:])
