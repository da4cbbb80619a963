"""An engine that follows a registry: it runs one registry version and, when asked between two
batches of events, takes the newest one (:mod:`cep.registry.changes`), leaving every rule,
query and metric that did not change — and its state — as it was.

Both the command line's followed runs (``vigil run --registry``) and ``vigil serve`` keep their
engine this way; the version an engine runs is recorded in the registry under a consumer name
(``vigil registry status``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from cep.engine import Engine
from cep.registry.changes import (
    ProgramChange,
    apply_change,
    build_engine,
    written_change,
)
from cep.registry.registry import Registry
from cep.registry.store import Entry
from query_lang import Program, ast

__all__ = ["AppliedVersion", "RegistryFollower"]


@dataclass(frozen=True)
class AppliedVersion:
    """A registry version an engine took: what changed and how long taking it lasted."""

    version: int
    change: ProgramChange
    seconds: float

    def describe(self) -> str:
        """``added: a; replaced: b, c`` (at most five names of each), or that nothing of the
        program changed."""
        parts = [f"{k}: {', '.join(v[:5])}{' ...' if len(v) > 5 else ''}"
                 for k, v in self.change.names().items() if v]
        return "; ".join(parts) or "no change to the program"


class RegistryFollower:
    """Keeps :attr:`engine` at the newest version of ``registry``.

    Parameters
    ----------
    registry : Registry
        The registry to follow.
    make_engine : callable
        Makes an empty engine (with the run's options); called when the program is built or
        rebuilt.
    consumer : str
        The name under which the applied version is recorded in the registry.

    Attributes
    ----------
    applied : int
        The registry version the engine runs.

    Examples
    --------
    >>> import os, tempfile
    >>> from cep.engine import Engine
    >>> path = os.path.join(tempfile.mkdtemp(), "r.vigil")
    >>> with open(path, "w") as f:
    ...     _ = f.write("stream txn (card string, amount float, ts timestamp) time ts\\n"
    ...                 "rule big from txn by card pattern b define b as amount > 500\\n")
    >>> registry = Registry(os.path.join(os.path.dirname(path), "registry.sqlite"))
    >>> _ = registry.push([path])
    >>> follower = RegistryFollower(registry, Engine, consumer="doc")
    >>> follower.applied, sorted(follower.engine.rules)
    (1, ['big'])
    >>> follower.poll() is None  # nothing new
    True
    >>> _ = registry.remove(["big"])
    >>> applied = follower.poll()
    >>> applied.version, applied.describe(), sorted(follower.engine.rules)
    (2, 'removed: big', [])
    >>> registry.close()
    """

    def __init__(
        self,
        registry: Registry,
        make_engine: Callable[[], Engine],
        *,
        consumer: str,
        version: int | None = None,
    ) -> None:
        self.registry = registry
        self.make_engine = make_engine
        self.consumer = consumer
        self.applied = registry.version if version is None else version
        entries = registry.store.current(self.applied) if self.applied else []
        self._by_key = {(e.space, e.name): e for e in entries}
        self.engine = build_engine(entries, make_engine)
        self.applied_at = time.time()
        self.failed_version: int | None = None
        self.apply_error: str | None = None
        if self.applied:
            registry.store.mark_applied(consumer, self.applied)

    @property
    def entries(self) -> list[Entry]:
        """The declarations of the version the engine runs, in the order they were added."""
        return list(self._by_key.values())

    @property
    def program(self) -> Program:
        """The program the engine runs, as declarations."""
        return Program([ast.Module(tuple(self.engine.declarations))])

    def poll(self) -> AppliedVersion | None:
        """Take the registry's newest version if the engine runs another (``None`` when it
        does not, or when that version already failed to apply).

        Raises
        ------
        Exception
            What the engine refused of the new version; the engine then runs the version it
            ran before, and the failed version is not tried again.
        """
        version = self.registry.version
        if version == self.applied or version == self.failed_version:
            return None
        return self.apply(version)

    def apply(self, version: int) -> AppliedVersion:
        """Take ``version`` (see :meth:`poll`)."""
        started = time.perf_counter()
        written = self.registry.store.written(self.applied, version)
        change = written_change(self._by_key, written)
        after = dict(self._by_key)
        for entry in written:
            key = (entry.space, entry.name)
            if entry.text is None:
                after.pop(key, None)
            else:
                after[key] = entry
        try:
            self.engine = apply_change(self.engine, change, list(after.values()),
                                       self.make_engine)
        except Exception as exc:
            # Back to the program it ran, whatever the failed change left of it.
            self.engine = build_engine(self.entries, self.make_engine, previous=self.engine)
            self.failed_version = version
            self.apply_error = f"version {version}: {exc}"
            raise
        self._by_key = after
        self.applied = version
        self.applied_at = time.time()
        self.apply_error = None
        self.registry.store.mark_applied(self.consumer, version)
        return AppliedVersion(version, change, time.perf_counter() - started)

