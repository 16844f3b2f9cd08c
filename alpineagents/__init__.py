"""alpineagents: agents whose runs survive crashes, deploys and moves between machines.

Give an :class:`Agent` a store and it saves each :class:`State` as the run goes; another
process can load the State later and continue it.
"""

from alpineagents.errors import (
    AlpineAgentsError,
    ConcurrentWriteError,
    CorruptStateError,
    ResumeWarning,
    SchemaVersionError,
    StateExistsError,
    StateNotFoundError,
    StoreError,
)
from alpineagents.filestore import FileStore
from alpineagents.state import HistoryEntry, State
from alpineagents.store import Record, SavedState, Store, open_store

__all__ = [
    "AlpineAgentsError",
    "ConcurrentWriteError",
    "CorruptStateError",
    "FileStore",
    "HistoryEntry",
    "Record",
    "ResumeWarning",
    "SavedState",
    "SchemaVersionError",
    "State",
    "StateExistsError",
    "StateNotFoundError",
    "Store",
    "StoreError",
    "open_store",
]
