"""The registry of standing queries: a durable, versioned store of the program's declarations,
changed whole or not at all (:mod:`cep.registry.registry`, :mod:`cep.registry.store`)."""

from cep.registry.registry import ChangeRefused, ChangeResult, Registry
from cep.registry.store import Change, Entry, RegistryError, RegistryStore

__all__ = [
    "Change",
    "ChangeRefused",
    "ChangeResult",
    "Entry",
    "Registry",
    "RegistryError",
    "RegistryStore",
]
