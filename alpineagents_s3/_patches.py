"""What changed of a snapshot, carried by the history entry a save commits with (layout 3).

A save of one history entry during a run commits by that entry's ``If-None-Match: *`` PUT
alone (``_writing``): it carries the snapshot's change in the entry's metadata instead of
replacing the snapshot object. A *change* says which values of the snapshot (or info) dict got
a new value and which were removed, each by its path of keys through nested dicts (a list or a
value is replaced whole); a load applies the changes of the entries after the snapshot's count,
in seq order, to the stored snapshot.

In the metadata a change is compact ASCII JSON, ``{"s":[[path, value], ...],"d":[path, ...]}``
(a path being a list of keys), with each space in it written as a JSON escape (``u0020`` after a
backslash): S3 keeps a header value's printable ASCII as sent, but SigV4 folds runs of spaces
and servers trim the ends. ``-`` is an entry that changes nothing. A change that would not fit
in the 2 KB S3 allows for an object's metadata is not made: the save replaces the snapshot
instead.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, TypeAlias

from alpineagents_s3.errors import CorruptStateError

# The metadata value of an entry whose save changed nothing of the snapshot.
NO_CHANGE: Final = "-"
# At most this many bytes of change in one entry's metadata (S3 allows 2 KB for all of it).
PATCH_LIMIT: Final = 1400

Path: TypeAlias = list[str]


def diff(before: Mapping[str, Any], after: Mapping[str, Any]) -> str | None:
    """The metadata value that turns ``before`` into ``after``; ``None`` if it would not fit.

    Raises ``ValueError`` or ``TypeError`` for a value JSON cannot hold (the caller checked
    ``after`` before: it does not).
    """
    sets: list[list[Any]] = []
    removes: list[Path] = []
    _diff(before, after, [], sets, removes)
    if not sets and not removes:
        return NO_CHANGE
    change: dict[str, Any] = {}
    if sets:
        change["s"] = sets
    if removes:
        change["d"] = removes
    text = json.dumps(change, ensure_ascii=True, separators=(",", ":"), allow_nan=False)
    text = text.replace(" ", "\\u0020")
    return text if len(text) <= PATCH_LIMIT else None


def _diff(
    before: Mapping[str, Any],
    after: Mapping[str, Any],
    path: Path,
    sets: list[list[Any]],
    removes: list[Path],
) -> None:
    for key, value in after.items():
        old = before.get(key, _MISSING)
        if _plain_dict(old) and _plain_dict(value):
            _diff(old, value, [*path, key], sets, removes)
        elif old is _MISSING or _json(old) != _json(value):
            # Compared as JSON: ``True == 1`` and ``1.0 == 1`` in Python, but not once stored.
            sets.append([[*path, key], value])
    removes.extend([*path, key] for key in before if key not in after)


_MISSING: Final = object()


def _plain_dict(value: Any) -> bool:
    """A dict JSON stores as it is (str keys only: ``{1: ...}`` would come back as ``"1"``)."""
    return isinstance(value, dict) and all(isinstance(k, str) for k in value)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def decode(value: str, where: str) -> tuple[list[tuple[Path, Any]], list[Path]]:
    """The values a metadata value sets, and the ones it removes; damage names ``where``."""
    if value == NO_CHANGE:
        return [], []
    try:
        change = json.loads(value)
    except (ValueError, RecursionError) as e:
        raise CorruptStateError(f"{where} has a damaged snapshot change: {e}") from e
    sets = change.get("s", []) if isinstance(change, dict) else None
    removes = change.get("d", []) if isinstance(change, dict) else None
    if (
        not isinstance(sets, list)
        or not isinstance(removes, list)
        or not all(isinstance(s, list) and len(s) == 2 and _is_path(s[0]) for s in sets)
        or not all(_is_path(p) for p in removes)
        or set(change) - {"s", "d"}
    ):
        raise CorruptStateError(f"{where} has a snapshot change S3Store does not write: {value!r}")
    return [(path, v) for path, v in sets], removes


def _is_path(value: Any) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(k, str) for k in value)


def apply(snapshot: dict[str, Any], value: str, where: str) -> dict[str, Any]:
    """``snapshot`` with the change of one entry's metadata ``value`` (copied where changed).

    Total, as a merge: a value set below one that is not a dict (another writer's save of data
    alone replaced it meanwhile) replaces it with a dict, a removed value that is not there is
    left out. So a load never fails on changes that two writers made.
    """
    sets, removes = decode(value, where)
    if not sets and not removes:
        return snapshot
    changed = dict(snapshot)
    copied: set[tuple[str, ...]] = {()}
    for path in removes:
        parent = _parent(changed, path, copied, create=False)
        if parent is not None:
            parent.pop(path[-1], None)
    for path, item in sets:
        parent = _parent(changed, path, copied, create=True)
        assert parent is not None
        parent[path[-1]] = item
    return changed


def _parent(
    root: dict[str, Any], path: Path, copied: set[tuple[str, ...]], *, create: bool
) -> dict[str, Any] | None:
    """The dict holding ``path``'s last key, copied on the way (the stored one is not changed).

    Where the way holds no dict: one is made (``create``), or ``None``.
    """
    node = root
    for depth, key in enumerate(path[:-1], start=1):
        child = node.get(key)
        if not isinstance(child, dict):
            if not create:
                return None
            child = {}
        elif tuple(path[:depth]) in copied:
            node = child
            continue
        else:
            child = dict(child)
        node[key] = child
        copied.add(tuple(path[:depth]))
        node = child
    return node
