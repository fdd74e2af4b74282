"""Resume rules by declaration (#43 item 4): each config key says, next to its declaration
(``fedmpi.schema.opt``), whether it can change a number the run stores (``result``) and whether it
may change when a run is resumed or extended (``resume``); the resume digest is the keys that may
not, and how a key entered the digest of checkpoints written before it existed is declared with it
(``Digest``), so ``Config`` keeps no hand-written cases. A checkpoint records the keys it covered
(``config_keys``): a key added after it was written continues it at its default, with no declaration
(tests/test_resume_stored.py: runs stored by earlier mains still resume bit for bit)."""

from __future__ import annotations

import dataclasses
import json
import os

import h5py
import numpy as np
import pytest
from conftest import synthetic_config

import fault_plugin
from fedmpi import checkpoint, config
from fedmpi.errors import InputError, Interrupted
from fedmpi.results import reader
from fedmpi.runner import Runner
from fedmpi.runtime import World


def test_every_top_level_key_declares_both_rules():
    for f in dataclasses.fields(config.Config):
        assert isinstance(f.metadata["result"], bool) and isinstance(f.metadata["resume"], bool), f.name


def test_what_readers_treat_as_run_only_is_what_the_keys_declare():
    """``fedmpi.results.reader.RUN_KEYS`` (torch-free, so a list there) are the keys declared
    ``result=False``: ``rounds``, ``runtime``, ``train.cuda_graphs``, the metrics-only evaluation keys."""
    assert sorted(config.run_keys()) == sorted(reader.RUN_KEYS)


def test_the_digest_covers_exactly_the_keys_that_may_not_change():
    cfg = config.from_dict(synthetic_config(train__cuda_graphs=True))
    keys = cfg.resume_keys()
    assert "seed" in keys and "train.lr" in keys and "availability.kind" in keys
    assert not any(k.split(".")[0] in ("rounds", "eval_every", "runtime", "evaluation", "output", "name")
                   for k in keys)
    assert "train.cuda_graphs" not in keys  # declared resume=True: how steps launch
    assert not any(k.startswith(("privacy.", "clock.")) for k in keys)  # off: left out (Digest.off)
    other = config.from_dict(synthetic_config(rounds=60, eval_every=3))
    assert other.resume_digest() == cfg.resume_digest()


def test_a_key_a_checkpoint_does_not_record_continues_it_only_at_its_default():
    cfg = config.from_dict(synthetic_config())
    record = dict(cfg.resume_keys())
    del record["train.lr_warmup"]  # as written before the key existed
    assert cfg.resume_refusals(record) == []
    warm = config.from_dict(synthetic_config(train__lr_warmup=2))
    assert warm.resume_refusals(record) == ["train.lr_warmup"]
    record["train.lr"] = "0.5"
    assert cfg.resume_refusals(record) == ["train.lr"]


def _backdate(folder: str, drop: str) -> None:
    """Make the checkpoint in ``folder`` look written before key ``drop`` existed: another digest,
    a record without it (resealed)."""
    path = os.path.join(folder, checkpoint.MANIFEST)
    with open(path) as fh:
        man = json.load(fh)
    del man["config_keys"][drop]
    man["config_digest"] = "0" * 16
    man["manifest_sha256"] = checkpoint._manifest_sha256(man)
    with open(path, "w") as fh:
        json.dump(man, fh)


def test_a_checkpoint_written_before_a_key_existed_resumes_bit_for_bit(tmp_path):
    """Its digest differs (the key is new), its record lacks the key, which is at its default: it
    continues and ends with the bits of a straight run; with the key set otherwise it is refused,
    naming the key."""
    data = synthetic_config(rounds=6, runtime={"checkpoint_every": 1, "progress": False})
    cfg = config.from_dict(data)
    straight, out = str(tmp_path / "straight.h5"), str(tmp_path / "r.h5")
    assert Runner(cfg, World(), straight, quiet=True).run() == 0
    with pytest.raises(Interrupted):
        Runner(cfg, World(), out, quiet=True, callbacks=[fault_plugin.inject("0:2:usr1")]).run()
    folder = checkpoint.folder_for(out)
    _backdate(folder, "train.lr_warmup")
    warm = config.from_dict({**data, "train": {**data["train"], "lr_warmup": 2}})
    with pytest.raises(InputError, match="config_digest: .*differs in train.lr_warmup"):
        checkpoint.load(World(), folder, warm.resume_digest(), 12, keys=warm.resume_keys(),
                        refusals=warm.resume_refusals)
    assert Runner(cfg, World(), out, quiet=True).run() == 0
    with h5py.File(straight) as a, h5py.File(out) as b:
        np.testing.assert_array_equal(a["final/params"][:], b["final/params"][:])
        np.testing.assert_array_equal(a["metrics/test_loss"][:], b["metrics/test_loss"][:])
