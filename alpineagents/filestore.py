"""FileStore: States in a local folder, one folder each.

Layout under the store's path::

    <id>/entries.jsonl   history entries, one JSON line each, only ever appended
    <id>/snapshot.json   the rest of the State, replaced atomically (temp file + os.replace)

A process killed while appending can leave a torn last line; it has no newline, is dropped
when read and cut off before the next append. A new State is written in a hidden folder and
renamed into place, so creating it is all or nothing and exclusive between processes.

A save whose snapshot is byte for byte the one on disk does not replace it.

Files are ``0600`` and folders ``0700`` whatever the umask (the folders it makes above the
store's path too): history holds tool results and messages.

Two writers. Every write holds an advisory lock (``flock``) on the State's folder itself, and
reads hold it shared, so a write sees the folder as no other write leaves it halfway. Before
it writes a byte, a write checks it against its basis, with one rule (``FileStore._check``):

    A write may go on only if the snapshot on disk is one its writer last saw (saved or
    loaded) or tried to write, the folder holds at least the entries its writer knows are
    saved, and every entry on disk from there on is one the write sends again, the same.

Anything else refuses the write with ``ConcurrentWriteError``, before a byte is written. The
basis (:class:`_Basis`) is the copy's: a save of a State (``store.save``, the Agent's saves)
writes with what that copy of the State last saw (:func:`alpineagents._saving.basis`), so
the check follows the copy's own history, whichever FileStore object for the folder writes
it. A write made through the Store API directly (``write()``, with no State behind it) has
what this store object last wrote or read of the State (its :class:`_Seen`), or, the first
time, what is on disk. Where ``fcntl`` is missing (Windows) writes are not locked: the check
still refuses a stale writer, but two writes racing at the same instant are not told apart.

Leftovers. A killed create leaves ``.<id>.<hex>.new``, a killed delete ``.<id>.<hex>.deleted``
(with the deleted State in it) and a killed snapshot write ``<id>/.snapshot.json.<hex>.tmp``.
Each is written while its writer holds the lock of the folder it is in, so
:meth:`FileStore.sweep` removes one only when that lock is free: its writer is gone.
"""

from __future__ import annotations

from alpineagents._filestore.base import ENTRIES as ENTRIES
from alpineagents._filestore.base import SNAPSHOT as SNAPSHOT
from alpineagents._filestore.doctor import Check, _Doctor
from alpineagents._filestore.leftovers import UNLOCKED_LEFTOVER_AGE as UNLOCKED_LEFTOVER_AGE
from alpineagents._filestore.leftovers import Deleted
from alpineagents._filestore.reading import _Reading
from alpineagents._filestore.writing import _Writing

__all__ = ["Check", "Deleted", "FileStore"]


class FileStore(_Writing, _Reading, _Doctor):
    """Keeps each State in a folder of its own under ``path``.

    One process at a time should run a given State; a second process that saves it anyway is
    refused with ``ConcurrentWriteError`` instead of losing or overwriting what the first one
    saved. The check follows the copy of the State being saved, not the store object: a copy
    saves when nothing was saved since it was last saved or loaded (through any FileStore
    object for the folder, in any process), and is refused, writing nothing, when anything
    was, even a save that changed only the snapshot (``state.data``, say). Two FileStores for
    one folder are the same store, and two copies of one State loaded through one object are
    told apart. The rule is in the module docstring. Limit: where ``fcntl`` is missing
    (Windows) writes are not locked, so two saves at the same instant can still both land.

    Leftovers of killed processes (a half-created State, a half-deleted one, a half-written
    snapshot) are removed by :meth:`sweep`, never while their writer is alive. The store calls
    it for its top folder by itself, once per store object at its first write and after every
    ``delete``.

    Args:
        path: The store's folder; made (``0700``, with any missing parents) at the first write.
        fsync: Also flush every write to disk, so a power cut loses nothing either. A killed
            process loses nothing saved without it.
    """
