"""Tokenizers of the text datasets (``task.text.tokenizer``).

- ``bytes`` (built in, no dependency): ids 0-255 are the bytes of the text's UTF-8 encoding,
  256 pads, 257 opens and 258 closes a document: a vocabulary of 259 that covers every text
  in every language, with no unknown token and nothing to download.
- a ``tokenizer.json`` (a model folder's, or the file itself), read by Hugging Face's
  ``tokenizers`` package (the optional extra ``[llm]``). Its special tokens come from the
  ``tokenizer_config.json`` beside it (``bos_token``, ``eos_token``, ``pad_token``, as
  ``transformers`` writes them), else from the usual names (``<s>``, ``</s>``,
  ``<|endoftext|>``, ``<pad>``...) when the vocabulary has them. Without a padding token the end
  token pads (the padding is never a target, so any id would do), without either id 0.

``encode`` gives each text's ids without special tokens and, for each id, the index of the
first character it covers, so that a per-character mask (which characters are targets to
learn) maps onto tokens whatever the tokenizer (``fedmpi.data.sequences``).
"""

from __future__ import annotations

import hashlib
import os
from typing import Optional

import numpy as np

from .. import provenance, yamlio
from ..errors import InputError
from ..inputs import read_input
from .arrays import TextInfo

BYTES = "bytes"
MAX_TOKENIZER_BYTES = 256 << 20  # the largest tokenizer.json in use is ~20 MB
_BOS = ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>", "[CLS]")
_EOS = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "[SEP]")
_PAD = ("<pad>", "[PAD]", "<|pad|>", "<|finetune_right_pad_id|>")


class Tokenizer:
    """Text -> token ids; ``info`` describes the vocabulary and the special ids."""

    info: TextInfo

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The ids of every text one after another (int64, no special tokens added), the index in
        its text of the first character each id covers, and how many ids each text has."""
        raise NotImplementedError


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as ids (0-255); 256 pad, 257 bos, 258 eos."""

    PAD, BOS, EOS = 256, 257, 258
    info = TextInfo(vocab_size=259, pad_id=PAD, tokenizer=BYTES, bos_id=BOS, eos_id=EOS)

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ids = np.frombuffer("".join(texts).encode("utf-8"), dtype=np.uint8)
        counts = np.fromiter((len(t.encode("utf-8")) for t in texts), dtype=np.int64, count=len(texts))
        chars = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
        char = np.cumsum((ids & 0xC0) != 0x80, dtype=np.int64) - 1  # each byte's character, all texts counted
        first = char - np.repeat(np.cumsum(chars) - chars, counts)
        return ids.astype(np.int64), first, counts


class FileTokenizer(Tokenizer):
    """A ``tokenizer.json`` read by the ``tokenizers`` package."""

    def __init__(self, tok, info: TextInfo):
        self._tok, self.info = tok, info

    def encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        encodings = self._tok.encode_batch(texts, add_special_tokens=False)
        counts = np.fromiter((len(e.ids) for e in encodings), dtype=np.int64, count=len(encodings))
        ids = np.fromiter((i for e in encodings for i in e.ids), dtype=np.int64, count=int(counts.sum()))
        first = np.fromiter((a for e in encodings for a, _ in e.offsets), dtype=np.int64, count=int(counts.sum()))
        return ids, first, counts


def load(spec: str, key: str = "task.text.tokenizer") -> Tokenizer:
    """The tokenizer ``spec`` names: ``bytes``, or a ``tokenizer.json`` or the folder holding it.
    Every problem is one ``InputError`` naming the file."""
    if spec == BYTES:
        return ByteTokenizer()
    path = os.path.abspath(os.path.expanduser(spec))
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    if not os.path.exists(path):
        raise InputError(f"{key}: {path}: no such tokenizer file (give {BYTES!r}, a tokenizer.json or "
                         f"a model folder holding one)")
    try:
        import tokenizers
    except ImportError:
        raise InputError(f"{key}: reading {path} needs the tokenizers package: pip install 'fedmpi[llm]'") from None
    data = _read(path, "tokenizer.json", key)
    try:
        tok = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise InputError(f"{key}: {path}: not UTF-8 text (a tokenizer.json)") from None
    except Exception as e:  # the Rust parser's error: the JSON or the tokenizer's fields
        detail = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise InputError(f"{key}: {path}: not a tokenizer.json ({detail})") from None
    vocab = tok.get_vocab_size(with_added_tokens=True)
    if vocab < 1:
        raise InputError(f"{key}: {path}: the tokenizer has an empty vocabulary")
    special = _special_tokens(os.path.join(os.path.dirname(path), "tokenizer_config.json"), key)

    def find(name: str, usual: tuple[str, ...]) -> Optional[int]:
        if name in special and special[name] is None:  # the config says there is none
            return None
        candidates = (special[name],) if name in special else usual
        return next((i for t in candidates if (i := tok.token_to_id(t)) is not None), None)

    bos, eos, pad = find("bos_token", _BOS), find("eos_token", _EOS), find("pad_token", _PAD)
    digest = hashlib.sha256(data).hexdigest()[:16]
    info = TextInfo(vocab_size=vocab, pad_id=pad if pad is not None else eos if eos is not None else 0,
                    tokenizer=f"{path} sha256:{digest}", bos_id=bos, eos_id=eos)
    return FileTokenizer(tok, info)


def _special_tokens(path: str, key: str) -> dict[str, Optional[str]]:
    """``bos_token``/``eos_token``/``pad_token`` of a ``tokenizer_config.json`` (a string,
    ``{"content": ...}``, or null: none), those it names; empty when there is no such file."""
    if not os.path.exists(path):
        return {}
    doc = yamlio.loads_json(_read(path, "tokenizer_config.json", key), f"{key}: {path}")
    if not isinstance(doc, dict):
        raise InputError(f"{key}: {path}: a tokenizer_config.json must hold a JSON object")
    out = {}
    for name in ("bos_token", "eos_token", "pad_token"):
        v = doc.get(name)
        v = v.get("content") if isinstance(v, dict) else v
        if v is not None and not isinstance(v, str):
            raise InputError(f"{key}: {path}: {name} must be a token (a string), got {type(v).__name__}")
        if name in doc:
            out[name] = v
    return out


def _read(path: str, what: str, key: str) -> bytes:
    try:
        data = read_input(path, what, key, limit=MAX_TOKENIZER_BYTES)
    except OSError as e:
        raise InputError(f"{key}: {path}: cannot read ({e.strerror or type(e).__name__})") from None
    provenance.note_input(path)
    return data
