"""alpineagents: agents whose runs survive crashes, deploys and moves between machines.

Give an :class:`Agent` a store and it saves each :class:`State` as the run goes; another
process can load the State later and continue it.
"""

from typing import TYPE_CHECKING, Any

from alpineagents.errors import (
    AlpineAgentsError,
    ConcurrentWriteError,
    CorruptStateError,
    NotJSONError,
    ResumeWarning,
    SchemaVersionError,
    StateExistsError,
    StateNotFoundError,
    StoreError,
    StorePermissionError,
)
from alpineagents.filestore import FileStore
from alpineagents.model import Model, ModelRequest, ModelResponse
from alpineagents.state import HistoryEntry, State
from alpineagents.store import Record, SavedState, Store, open_store
from alpineagents.tools import Tool

if TYPE_CHECKING:
    from alpineagents.agent import Agent
    from alpineagents.anthropic import AnthropicModel

__all__ = [
    "Agent",
    "AlpineAgentsError",
    "AnthropicModel",
    "ConcurrentWriteError",
    "CorruptStateError",
    "FileStore",
    "HistoryEntry",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "NotJSONError",
    "Record",
    "ResumeWarning",
    "SavedState",
    "SchemaVersionError",
    "State",
    "StateExistsError",
    "StateNotFoundError",
    "Store",
    "StoreError",
    "StorePermissionError",
    "Tool",
    "open_store",
]


def __getattr__(name: str) -> Any:
    """Import ``Agent`` and ``AnthropicModel`` on first use.

    They bring in the anthropic SDK (about 2 s of CPU), which the CLI, the stores and store
    plugins do not need.
    """
    if name == "Agent":
        from alpineagents.agent import Agent

        return Agent
    if name == "AnthropicModel":
        from alpineagents.anthropic import AnthropicModel

        return AnthropicModel
    raise AttributeError(f"module 'alpineagents' has no attribute {name!r}")
