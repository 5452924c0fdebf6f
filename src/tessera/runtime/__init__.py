"""Tessera's runtime: the only layer that talks to MPI.

World (communicators, progress mode, clean stop, recorded collectives incl. all-to-all),
Group (sub-communicators made by `World.split`), GlobalArray (distributed blocks over MPI
one-sided operations), TaskCounter (atomic fetch-and-add), CommLog (communication
accounting). Importing this package does not initialise MPI; `World.get()` does.
See docs/runtime.md.
"""

from tessera.profile.commlog import CommLog, CommRecord, CommSummary, OpTotal
from tessera.runtime.counter import TaskCounter
from tessera.runtime.distribution import assign_owners
from tessera.runtime.global_array import GlobalArray
from tessera.runtime.group import Group
from tessera.runtime.handle import Handle
from tessera.runtime.layout import BlockLayout, Piece
from tessera.runtime.options import RuntimeOptions
from tessera.runtime.world import World

__all__ = [
    "BlockLayout",
    "CommLog",
    "CommRecord",
    "CommSummary",
    "GlobalArray",
    "Group",
    "Handle",
    "OpTotal",
    "Piece",
    "RuntimeOptions",
    "TaskCounter",
    "World",
    "assign_owners",
]
