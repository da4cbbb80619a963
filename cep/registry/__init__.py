"""The registry of standing queries: a durable, versioned store of the program's declarations,
changed whole or not at all (:mod:`cep.registry.registry`, :mod:`cep.registry.store`), and how
a running engine takes a new version (:mod:`cep.registry.changes`,
:mod:`cep.registry.follower`)."""

from cep.registry.changes import ProgramChange, apply_change, build_engine, written_change
from cep.registry.follower import AppliedVersion, RegistryFollower
from cep.registry.registry import ChangeRefused, ChangeResult, Registry
from cep.registry.store import Change, Entry, RegistryError, RegistryStore

__all__ = [
    "AppliedVersion",
    "Change",
    "ChangeRefused",
    "ChangeResult",
    "Entry",
    "ProgramChange",
    "Registry",
    "RegistryError",
    "RegistryFollower",
    "RegistryStore",
    "apply_change",
    "build_engine",
    "written_change",
]
