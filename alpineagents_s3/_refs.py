"""A snapshot's model context without the long texts its history entries already hold.

alpineagents 0.2-0.4 keep the model context (the messages since the last compaction) in the
snapshot, so each snapshot PUT would send the conversation again: a long tool result or reply
is in its history entry and in every later snapshot. The snapshot object keeps such a text
(``MIN_LENGTH`` characters or more, anywhere under ``context``, or in the answers, which copy
the last reply) as a *reference* instead: the seq of an entry of the State's history that
holds the same text, where it is in that entry, and a digest of the text, which a load
checks. A load reads the whole history anyway, so putting the texts back costs no request.

A store object refers only to entries below the count of the snapshot being written, which
are the history's for good (never replaced below a snapshot's count), and finds them in its
``Texts``: the entries it saved, the references of a snapshot it read or met before a save,
and the texts a snapshot it read kept whole that the newest entries hold. After a failed
save it keeps only those below the count it last wrote or read.

The snapshot object of such a core (``has_context``) is *layout 2* (its
``alpineagents-layout`` metadata): its body is gzip-compressed (the frames of the context's
messages, their roles, block types and ids, shrink about 7 times), and holds::

    {"alpineagents-refs": 1,
     "refs": [[["context", 3, "content", 0, "text"], 5, ["content", "message", ...], "<digest>"]],
     "snapshot": {... the snapshot, each referred text replaced by ""}}

Nothing else of the snapshot is changed: ``list()`` builds a State's summary from the
snapshot alone, and those cores' summaries read none of ``REFERRED``. A JSON body never begins
with gzip's two magic bytes, so a body tells which it is.
"""

from __future__ import annotations

import gzip
import hashlib
import zlib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias

from alpineagents_s3._codec import check_format, dumps
from alpineagents_s3.errors import CorruptStateError

# Texts shorter than this stay in the snapshot: a reference costs about 100 bytes.
MIN_LENGTH: Final = 256
# A snapshot holding a model context (alpineagents 0.2-0.4) has it under this key.
CONTEXT: Final = "context"
# The parts of such a snapshot whose texts are referred to: the context, and the run's answers
# (a copy of the last reply's text). Their summary (``list()``) reads none of them.
REFERRED: Final = (CONTEXT, "last_answer", "finish_answer")
# The key of a snapshot without a context whose long text may be kept in an entry: this
# repository's core copies a run's reply there when the run stops.
COPIES: Final = ("answer",)
FIELD: Final = "alpineagents-refs"
FORMAT: Final = 1
GZIP_MAGIC: Final = b"\x1f\x8b"
# What a layout 2 body may inflate to: far more than any snapshot (a damaged or hostile object
# is refused instead of filling the memory).
MAX_SNAPSHOT: Final = 1 << 30

Path: TypeAlias = tuple[str | int, ...]


def digest(text: str) -> str:
    """A digest of ``text`` (128 bits of BLAKE2b of its UTF-8), stored with each reference.

    A store object finds the entry holding a text by it, so two texts with one digest would
    put one in the other's place unseen: finding such a pair takes about 2**64 tries, out of
    reach of whoever writes tool results (64 bits would take 2**32: minutes).
    """
    return hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


@dataclass
class Texts:
    """The long texts of one State's history this store object may refer to.

    Attributes:
        generation: The State's generation (a State created again under the same id is another).
        where: The digest of each text, with the seq and path of an entry that holds it.
        final: The count of the snapshot this store object last wrote or read: the entries
            below it are the history's for good, whatever a later save does.
        context: ``False`` for a State whose snapshots hold no model context (this
            repository's core, alpineagents 0.5+): nothing to refer to, nothing indexed.
    """

    generation: str
    where: dict[str, tuple[int, Path]] = field(default_factory=dict)
    final: int = 0
    context: bool = True

    def add(self, entries: Sequence[Mapping[str, Any]]) -> None:
        """Add the long texts of ``entries`` (part of the history)."""
        for entry in entries:
            seq = entry["seq"]
            for path, text in _texts(entry):
                self.where.setdefault(digest(text), (seq, path))

    def with_entries(self, entries: Sequence[Mapping[str, Any]]) -> Texts:
        """A copy that also holds the texts of ``entries``."""
        texts = Texts(self.generation, dict(self.where), self.final)
        texts.add(entries)
        return texts

    def finals(self) -> Texts:
        """Only the texts of entries below ``final`` (what a failed save leaves sure)."""
        kept = {d: (seq, path) for d, (seq, path) in self.where.items() if seq < self.final}
        return Texts(self.generation, kept, self.final)


def _texts(value: Any) -> Iterator[tuple[Path, str]]:
    """The texts of ``MIN_LENGTH`` characters or more in a JSON value, with their paths."""
    stack: list[tuple[Path, Any]] = [((), value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, str):
            if len(item) >= MIN_LENGTH:
                yield path, item
        elif isinstance(item, dict):
            # A key JSON spells as a str ({1: ...} as {"1": ...}) could stand for another: a
            # dict with one is not looked into, as it is not stored as it is.
            if all(isinstance(k, str) for k in item):
                stack.extend(((*path, k), v) for k, v in item.items())
        elif isinstance(item, list):
            stack.extend(((*path, i), v) for i, v in enumerate(item))


def has_context(snapshot: Mapping[str, Any] | None) -> bool:
    """Whether ``snapshot`` holds a model context (alpineagents 0.2-0.4)."""
    return snapshot is not None and isinstance(snapshot.get(CONTEXT), list)


def encode(
    snapshot: Mapping[str, Any] | None,
    texts: Texts | None,
    what: str,
    used: set[str] | None = None,
    entries: Sequence[Mapping[str, Any]] = (),
) -> bytes:
    """The snapshot object's body: its JSON, or for a snapshot with a model context, layout 2.

    The digests of the texts it refers to are added to ``used``. Raises what
    :func:`~alpineagents_s3._codec.dumps` raises for a value JSON cannot hold.

    A snapshot without a context whose answer (``COPIES``) is a long text one of ``entries``
    (the save's, which the snapshot counts) holds, as the answer of a run that stopped with a
    reply copies the reply, refers to it the same way: the reply is not sent twice.
    """
    if snapshot is None:
        return dumps(snapshot, what)
    if not has_context(snapshot):
        return _encode_copies(snapshot, entries, what)
    refs: list[list[Any]] = []
    kept: dict[str, Any] = {}
    found: set[str] = set()
    if texts is not None and texts.where:
        try:
            for key in REFERRED:
                if key in snapshot:
                    kept[key] = _swap(snapshot[key], (key,), texts.where, refs, found)
        except RecursionError:  # nested too deep to walk: kept whole (dumps says if it can be)
            refs, kept = [], {}
    body = dumps({FIELD: FORMAT, "refs": refs, "snapshot": {**snapshot, **kept}}, what)
    if used is not None and refs:
        used.update(found)
    return compress(body)


def _encode_copies(
    snapshot: Mapping[str, Any], entries: Sequence[Mapping[str, Any]], what: str
) -> bytes:
    """A snapshot without a context: its JSON, or its copies of ``entries``' texts referred to.

    Only ``COPIES`` is looked at, which no core's list summary reads (``list()`` builds the
    summary without the history to put texts back); with references the body is compressed,
    as a snapshot with a context is.
    """
    long = [
        k for k in COPIES if isinstance(snapshot.get(k), str) and len(snapshot[k]) >= MIN_LENGTH
    ]
    if not long or not entries:
        return dumps(snapshot, what)
    where = Texts("").with_entries(entries).where
    refs: list[list[Any]] = []
    found: set[str] = set()
    kept = {key: _swap(snapshot[key], (key,), where, refs, found) for key in long}
    if not refs:
        return dumps(snapshot, what)
    return compress(dumps({FIELD: FORMAT, "refs": refs, "snapshot": {**snapshot, **kept}}, what))


def compress(body: bytes) -> bytes:
    """``body`` gzip-compressed, the same bytes for the same ``body`` (no time in the header)."""
    return gzip.compress(body, compresslevel=6, mtime=0)


def decompress(body: bytes, where: str) -> bytes:
    """The JSON of a layout 2 body; ``CorruptStateError`` naming ``where`` if it is damaged."""
    inflate = zlib.decompressobj(wbits=31)  # gzip
    try:
        out = inflate.decompress(body, MAX_SNAPSHOT)
    except zlib.error as e:
        raise CorruptStateError(f"{where} is a damaged compressed snapshot: {e}") from e
    if inflate.unconsumed_tail:
        raise CorruptStateError(f"{where} holds a snapshot of more than {MAX_SNAPSHOT} bytes")
    if not inflate.eof or inflate.unused_data:
        raise CorruptStateError(f"{where} is a compressed snapshot cut short, or followed by more")
    return out


def _swap(
    value: Any,
    path: Path,
    where: Mapping[str, tuple[int, Path]],
    refs: list[Any],
    used: set[str],
) -> Any:
    """``value``, each long text an entry holds replaced by ``""`` and referred to in ``refs``."""
    if isinstance(value, str):
        if len(value) >= MIN_LENGTH:
            key = digest(value)
            found = where.get(key)
            if found is not None:
                refs.append([list(path), found[0], list(found[1]), key])
                used.add(key)
                return ""
        return value
    if isinstance(value, list):
        return [_swap(v, (*path, i), where, refs, used) for i, v in enumerate(value)]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _swap(v, (*path, k), where, refs, used) for k, v in value.items()}
    return value


@dataclass(frozen=True)
class Ref:
    """One text of the snapshot kept in a history entry."""

    path: Path
    seq: int
    entry_path: Path
    digest: str


def compressed(body: bytes) -> bool:
    """Whether a snapshot object's body is a layout 2 body (:func:`encode`), not JSON."""
    return body.startswith(GZIP_MAGIC)


def unwrap(parsed: Any, where: str) -> tuple[dict[str, Any], list[Ref]]:
    """The snapshot (its referred texts ``""``) and references of a body :func:`encode` wrote."""
    if not isinstance(parsed, dict) or FIELD not in parsed:
        raise CorruptStateError(f"{where} is not a State snapshot with references")
    check_format(parsed[FIELD], FORMAT, where, "a snapshot with references", "reference")
    snapshot, raw = parsed.get("snapshot"), parsed.get("refs")
    if not isinstance(snapshot, dict) or not isinstance(raw, list):
        raise CorruptStateError(f"{where} is a snapshot with references, damaged")
    refs = []
    for item in raw:
        if not (
            isinstance(item, list)
            and len(item) == 4
            and _is_path(item[0])
            and isinstance(item[1], int)
            and not isinstance(item[1], bool)
            and item[1] >= 0
            and _is_path(item[2])
            and isinstance(item[3], str)
        ):
            raise CorruptStateError(f"{where} holds a damaged reference: {item!r}")
        refs.append(Ref(tuple(item[0]), item[1], tuple(item[2]), item[3]))
    return snapshot, refs


def _is_path(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(p, str) or (isinstance(p, int) and not isinstance(p, bool)) for p in value
    )


def resolve(
    snapshot: dict[str, Any], refs: Sequence[Ref], entries: Sequence[Mapping[str, Any]], where: str
) -> dict[str, Any]:
    """``snapshot`` with each referred text put back from ``entries`` (the history from seq 0).

    Raises ``CorruptStateError`` naming the snapshot object and the reference when the entry
    does not hold the text.
    """
    for ref in refs:
        spot = "/".join(map(str, ref.path))
        if ref.seq >= len(entries):
            raise CorruptStateError(
                f"{where} keeps the text at {spot} in history entry {ref.seq}, but the State's "
                f"history has {len(entries)} entries"
            )
        text = _at(entries[ref.seq], ref.entry_path)
        if not isinstance(text, str) or digest(text) != ref.digest:
            raise CorruptStateError(
                f"{where} keeps the text at {spot} in history entry {ref.seq} (at "
                f"{'/'.join(map(str, ref.entry_path))}), which does not hold it: the entry or "
                "the snapshot was damaged"
            )
        parent = _at(snapshot, ref.path[:-1])
        last = ref.path[-1] if ref.path else None
        if isinstance(parent, dict) and isinstance(last, str) and parent.get(last) == "":
            parent[last] = text
        elif isinstance(parent, list) and isinstance(last, int) and _blank(parent, last):
            parent[last] = text
        else:
            raise CorruptStateError(f"{where} refers to the text at {spot}, which it lacks")
    return snapshot


def _blank(items: list[Any], index: int) -> bool:
    return 0 <= index < len(items) and items[index] == ""


def _at(value: Any, path: Path) -> Any:
    """The value at ``path`` in ``value``, or ``None`` if there is none."""
    for step in path:
        if isinstance(value, dict) and isinstance(step, str):
            value = value.get(step)
        elif isinstance(value, list) and isinstance(step, int) and 0 <= step < len(value):
            value = value[step]
        else:
            return None
    return value


def texts_of(generation: str, refs: Sequence[Ref], final: int) -> Texts:
    """What a snapshot read (of ``final`` entries) tells of the texts its history holds."""
    return Texts(generation, {ref.digest: (ref.seq, ref.entry_path) for ref in refs}, final)


def whole_texts(snapshot: Mapping[str, Any]) -> dict[str, int]:
    """The long texts a snapshot read keeps whole where texts are referred to (digest: length).

    Its writer did not know them (a store object saving a State it did not read) or no entry
    holds them (a compaction's summary). Called before :func:`resolve` fills the references in.
    """
    found: dict[str, int] = {}
    for key in REFERRED:
        if key in snapshot:
            for _, text in _texts(snapshot[key]):
                found[digest(text)] = len(text)
    return found


def find_texts(
    texts: Texts, history: Sequence[Mapping[str, Any]], wanted: Mapping[str, int], depth: int
) -> None:
    """Add to ``texts`` where the newest ``depth`` entries of ``history`` hold ``wanted``.

    The context holds the messages since the last compaction, the newest entries': looking
    no further keeps a load of a long history from walking all of it.
    """
    lengths = set(wanted.values())
    for entry in reversed(history[max(0, len(history) - depth) :]):
        for path, text in _texts(entry):
            if len(text) in lengths:
                key = digest(text)
                if key in wanted:
                    texts.where.setdefault(key, (entry["seq"], path))
