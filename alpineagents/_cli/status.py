"""Exit statuses and the expected-failure error of the ``alpineagents`` command.

Here rather than in :mod:`alpineagents.cli`, so that the commands can use them without
importing the module that imports them.
"""

from __future__ import annotations

__all__ = [
    "EXIT_CONFLICT",
    "EXIT_FAILURE",
    "EXIT_INTERRUPTED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_PIPE",
    "EXIT_USAGE",
    "CommandError",
]

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_NOT_FOUND = 3
EXIT_CONFLICT = 4
EXIT_INTERRUPTED = 130
EXIT_PIPE = 141


class CommandError(Exception):
    """An expected failure of a command: one line for the user and an exit status."""

    def __init__(self, message: str, status: int = EXIT_FAILURE):
        super().__init__(message)
        self.status = status
