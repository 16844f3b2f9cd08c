"""The exceptions and warnings of alpineagents.

Every error the library raises on its own account derives from :class:`AlpineAgentsError`.
Where the user guide names a builtin (a taken id is a ``ValueError``, an unknown id a
``KeyError``), the error derives from that builtin too, so ``except ValueError:`` works; so
does a store's refusal of access (a ``PermissionError``).
"""

from __future__ import annotations

__all__ = [
    "AlpineAgentsError",
    "ConcurrentWriteError",
    "CorruptStateError",
    "NotJSONError",
    "ResumeWarning",
    "SchemaVersionError",
    "StateExistsError",
    "StateNotFoundError",
    "StoreError",
    "StorePermissionError",
]


class AlpineAgentsError(Exception):
    """The root of every error alpineagents raises on its own account."""


class StoreError(AlpineAgentsError):
    """A store could not read or write a State."""


class StateExistsError(StoreError, ValueError):
    """A new State was written with an id the store already has."""


class StateNotFoundError(StoreError, KeyError):
    """The store has no State with the id asked for."""

    def __str__(self) -> str:
        # KeyError quotes its argument; the message reads better as it is.
        return str(self.args[0]) if self.args else ""


class StorePermissionError(StoreError, PermissionError):
    """The store refused access to a State or to its place (a file's mode, a bucket policy).

    A ``PermissionError`` too, so ``except PermissionError:`` works.
    """


class CorruptStateError(StoreError):
    """A stored object is damaged or was not written by alpineagents."""


class SchemaVersionError(StoreError):
    """A stored object was written by a newer version of alpineagents than this one."""


class ConcurrentWriteError(StoreError):
    """Another process wrote the same State since this one last saved it."""


class ResumeWarning(UserWarning):
    """A State is run by an Agent that differs from the one that saved it."""


class NotJSONError(AlpineAgentsError, TypeError):
    """A value a State would keep is not JSON that every store can write and read back.

    The message names the path to the value (``state.data['a'][3]``, ``tool result of
    call_2 (lookup)``). A ``TypeError`` too, as the user guide says for ``state.data``.
    """
