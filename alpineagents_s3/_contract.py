"""The one place that meets the installed alpineagents: its public Store contract, nothing more.

Two generations of that contract are in use, and S3Store serves both with the same code:

========================  =========================================  ===========================
                          snapshot (alpineagents 0.2-0.4, this repo)  info (alpineagents 0.5+)
========================  =========================================  ===========================
``write`` 3rd argument    ``snapshot``: a dict, or ``None`` to keep   ``info``: always a mapping
                          the current one (also on ``create``)
``Record``                ``Record(entries, snapshot)``               ``Record(entries, info)``
list summary              ``SavedState.from_snapshot(id, snapshot)``  ``StateInfo.from_info(id,
                                                                      info)``
summary ``updated_at``    always a datetime                           may be ``None``
========================  =========================================  ===========================

Both name the same errors: a taken id on ``create`` is a ``ValueError``, a write to an id the
store does not have a ``LookupError``, and ``read`` of an unknown id returns ``None``. The
small dict is opaque here (0.4 keeps the whole model context in it, so it can be large).

Only ``Store``, ``Record`` and the summary class are imported, from ``alpineagents.store``,
which every published version exports.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from importlib import metadata
from typing import Any, Final

import alpineagents
import alpineagents.store as _core_store
from alpineagents.store import Record, Store

__all__ = [
    "CORE_VERSION",
    "DELETE_OF_UNKNOWN_RAISES",
    "GENERATION",
    "Record",
    "Store",
    "Summary",
    "make_record",
    "newest_first",
    "summarize",
]


def _core_version() -> str:
    try:
        return metadata.version("alpineagents")
    except metadata.PackageNotFoundError:  # imported from a source tree that is not installed
        return "unknown"


CORE_VERSION: Final = _core_version()

Summary = Any  # SavedState (snapshot generation) or StateInfo (info generation)

_from_info: Callable[[str, Mapping[str, Any]], Any] | None = None
_from_snapshot: Callable[[str, Mapping[str, Any]], Any] | None = None
if hasattr(_core_store, "StateInfo"):
    _from_info = _core_store.StateInfo.from_info
elif hasattr(_core_store, "SavedState"):
    _from_snapshot = _core_store.SavedState.from_snapshot
else:  # pragma: no cover - no published version lacks both
    raise ImportError(
        f"alpineagents_s3 does not know the Store contract of alpineagents {CORE_VERSION}: "
        "alpineagents.store has neither SavedState (0.2-0.4) nor StateInfo (0.5+)"
    )

GENERATION: Final = "info" if _from_info is not None else "snapshot"
_EPOCH: Final = datetime.min.replace(tzinfo=UTC)


def make_record(entries: Sequence[dict[str, Any]], small: dict[str, Any] | None) -> Record:
    """The installed core's ``Record`` of ``entries`` and the snapshot or info dict."""
    return Record(list(entries), small)  # type: ignore[arg-type]  # None: 0.2-0.4 only


def summarize(state_id: str, small: dict[str, Any]) -> Summary:
    """The installed core's list summary of a State, built by the core's own class method.

    Raises what that method raises for a dict it cannot read (``KeyError``, ``ValueError``,
    ``TypeError``, or the core's own error).
    """
    if _from_info is not None:
        return _from_info(state_id, small)
    assert _from_snapshot is not None
    return _from_snapshot(state_id, small)


def newest_first(summaries: list[Summary]) -> list[Summary]:
    """Most recently updated first; a summary without ``updated_at`` (0.5+) last."""
    return sorted(summaries, key=lambda s: getattr(s, "updated_at", None) or _EPOCH, reverse=True)


# Whether ``delete`` of an unknown id raises: this repository's core (which defines
# ``StateNotFoundError``) says ``KeyError``; the published contract says "does nothing".
DELETE_OF_UNKNOWN_RAISES: Final = hasattr(alpineagents, "StateNotFoundError")
