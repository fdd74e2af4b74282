"""JSONL instruction or chat data with a user field, each user a client: the form of FedLLM-Bench
and of pfl-research's Aya and OpenAssistant user partitions.

Each line is one JSON object: a record of the user named by its ``task.jsonl.user_field`` (a
string or an integer), in one of three forms (other fields are ignored):

- ``{"text": ...}``: plain text, learnt whole;
- ``{"instruction": ..., "input": ..., "response": ...}`` (``input`` optional; the aliases
  ``prompt``/``inputs`` for the instruction, ``context`` for the input, ``output``/
  ``completion``/``targets`` for the response: Alpaca's, Dolly's, Aya's names);
- ``{"messages": [{"role": ..., "content": ...}, ...]}`` (alias ``conversations``, with
  ShareGPT's ``from``/``value`` too; roles user/human/prompter, assistant/gpt/bot/model, system).

A record becomes one document through an Alpaca-style template, the same for every tokenizer:

    ### Instruction:\\n{instruction}\\n\\n[### Input:\\n{input}\\n\\n]### Response:\\n{response}
    ### System:\\n{content}\\n\\n### User:\\n{content}\\n\\n### Assistant:\\n{content}...

With ``task.jsonl.loss: response`` only the response (every assistant turn's content) is learnt:
the headings, the instruction, the input and the user's and system's turns are context whose
targets are ``IGNORE`` (pfl-research's and FedLLM-Bench's masking); with ``all`` (the default)
every token is. A folder holds one such file per name (``*.jsonl``, read in name order). Blank
lines are skipped; every other problem is one ``InputError`` naming the file and the line.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import psutil

from .. import provenance, yamlio
from ..errors import InputError
from ..inputs import open_input
from .leaf import PARSED_PER_BYTE, split_files

MAX_LINE_BYTES = 16 << 20  # one record; Aya's and OpenAssistant's are a few kB
LAYOUT = "JSONL: one object per line with a user field and text, instruction/response or messages"
_INSTRUCTION = ("instruction", "prompt", "inputs")
_INPUT = ("input", "context")
_RESPONSE = ("response", "output", "completion", "targets")
_CHAT = ("messages", "conversations")
_ROLES = {"user": "User", "human": "User", "prompter": "User", "assistant": "Assistant", "gpt": "Assistant",
          "bot": "Assistant", "model": "Assistant", "system": "System"}

Loss = Literal["all", "response"]
Record = tuple[str, str, "np.ndarray | None"]  # (user, text, mask)


def read(path: str, key: str, user_field: str, loss: Loss) -> list[list[Record]]:
    """Each user's records of the split ``path`` names (a file or a folder of ``.jsonl``), as
    documents ``(user, text, mask)``: one list per user, users in order of first appearance."""
    users: dict[str, list[Record]] = {}
    for f in split_files(path, key, ".jsonl", LAYOUT):
        for n, record in _lines(f, key):
            where = f"{f}:{n}"
            if not isinstance(record, dict):
                raise InputError(f"{where}: a record must be a JSON object, got {type(record).__name__}")
            user = record.get(user_field)
            if user is None or isinstance(user, bool) or not isinstance(user, (str, int)):
                got = "no such field" if user_field not in record else f"got {type(user).__name__}"
                raise InputError(f"{where}: the user field {user_field!r} (task.jsonl.user_field) must be a "
                                 f"string or an integer ({got})")
            text, mask = document(record, where, loss)
            users.setdefault(str(user), []).append((str(user), text, mask))
    if not users:
        raise InputError(f"{path}: holds no records ({key}, {LAYOUT})")
    return list(users.values())


def _lines(path: str, key: str):
    """(line number, parsed JSON) of every non-blank line; lines over ``MAX_LINE_BYTES`` and
    files larger than 1/8 of the available memory are refused unread."""
    limit = max(psutil.virtual_memory().available // PARSED_PER_BYTE, 1 << 20)
    try:
        with open_input(path, "JSONL file", key, limit=limit) as fh:
            n = 0
            while line := fh.readline(MAX_LINE_BYTES + 1):
                n += 1
                if len(line) > MAX_LINE_BYTES:
                    raise InputError(f"{path}:{n}: a line longer than the {MAX_LINE_BYTES / 2**20:g} MiB a record "
                                     f"may hold ({LAYOUT})")
                try:
                    text = line.decode("utf-8-sig" if n == 1 else "utf-8")
                except UnicodeDecodeError as e:
                    raise InputError(f"{path}:{n}: not UTF-8 text (byte {e.start} of the line)") from None
                if text.strip():
                    yield n, yamlio.loads_json(text, f"{path}:{n}")
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or type(e).__name__}; {key})") from None
    provenance.note_input(path)


def _field(record: dict, names: tuple[str, ...], where: str, required: bool = True) -> str | None:
    """The one field of ``names`` the record has, a non-empty string (None when absent and not
    ``required``)."""
    present = [k for k in names if k in record]
    if len(present) > 1:
        raise InputError(f"{where}: {present[0]!r} and {present[1]!r} name the same part of a record: keep one")
    if not present:
        if required:
            raise InputError(f"{where}: no {names[0]!r} field (or {', '.join(map(repr, names[1:]))}; {LAYOUT})")
        return None
    v = record[present[0]]
    if not isinstance(v, str) or not v:
        raise InputError(f"{where}: {present[0]!r} must be a non-empty string, got "
                         f"{'an empty string' if v == '' else type(v).__name__}")
    return v


def document(record: dict, where: str, loss: Loss) -> tuple[str, "np.ndarray | None"]:
    """A record's text through the template, and its mask (None: learnt whole)."""
    forms = [name for name, keys in (("text", ("text",)), ("instruction", _INSTRUCTION), ("messages", _CHAT))
             if any(k in record for k in keys)]
    if len(forms) != 1:
        got = "none" if not forms else " and ".join(forms)
        raise InputError(f"{where}: a record holds one of text, instruction/response or messages, got {got}")
    if forms == ["text"]:
        parts = [(_field(record, ("text",), where), True)]
    elif forms == ["instruction"]:
        context = _field(record, _INPUT, where, required=False)
        parts = [("### Instruction:\n", False), (_field(record, _INSTRUCTION, where), False), ("\n\n", False)]
        if context is not None:
            parts += [("### Input:\n", False), (context, False), ("\n\n", False)]
        parts += [("### Response:\n", False), (_field(record, _RESPONSE, where), True)]
    else:
        parts = _chat(record, where)
    text = "".join(p for p, _ in parts)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{where}: a string holds an unpaired surrogate (\\ud800-\\udfff escape), not text") from None
    if loss == "all" or forms == ["text"]:
        return text, None
    return text, np.repeat(np.array([learn for _, learn in parts], dtype=bool), [len(p) for p, _ in parts])


def _chat(record: dict, where: str) -> list[tuple[str, bool]]:
    name = next(k for k in _CHAT if k in record)
    turns: Any = record[name]
    if sum(k in record for k in _CHAT) > 1:
        raise InputError(f"{where}: 'messages' and 'conversations' name the same part of a record: keep one")
    if not isinstance(turns, list) or not turns:
        raise InputError(f"{where}: {name!r} must be a non-empty list of {{role, content}} turns")
    parts: list[tuple[str, bool]] = []
    for t, turn in enumerate(turns):
        at = f"{where}: {name}[{t}]"
        if not isinstance(turn, dict):
            raise InputError(f"{at}: a turn must be an object {{role, content}}, got {type(turn).__name__}")
        role = _field(turn, ("role", "from"), at)
        content = _field(turn, ("content", "value"), at)
        if role.lower() not in _ROLES:
            raise InputError(f"{at}: unknown role {role[:40]!r} (roles: {', '.join(_ROLES)})")
        heading = _ROLES[role.lower()]
        parts += [("\n\n" if parts else "", False), (f"### {heading}:\n", False), (content, heading == "Assistant")]
    return parts
