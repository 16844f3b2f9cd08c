"""The implementation of the ``alpineagents`` command (see :mod:`alpineagents.cli`)."""
