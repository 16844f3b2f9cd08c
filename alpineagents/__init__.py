"""alpineagents: agents whose runs survive crashes, deploys and moves between machines.

Give an :class:`Agent` a store and it saves each :class:`State` as the run goes; another
process can load the State later and continue it.
"""

from alpineagents.agent import Agent
from alpineagents.anthropic import AnthropicModel
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
from alpineagents.model import Model, ModelRequest, ModelResponse
from alpineagents.state import HistoryEntry, State
from alpineagents.store import Record, SavedState, Store, open_store
from alpineagents.tools import Tool

__all__ = [
    "Agent",
    "AnthropicModel",
    "AlpineAgentsError",
    "ConcurrentWriteError",
    "CorruptStateError",
    "FileStore",
    "HistoryEntry",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "Record",
    "ResumeWarning",
    "SavedState",
    "SchemaVersionError",
    "State",
    "StateExistsError",
    "StateNotFoundError",
    "Store",
    "StoreError",
    "Tool",
    "open_store",
]
