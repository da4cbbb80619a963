"""The per-key processing contract shared by the embedded engine and the Spark operator.

A :class:`KeyedProcessor` is immutable and shared (compiled rules); everything that belongs to one
partition key lives in an opaque ``bytes`` state value that the caller stores (a dict in the
embedded engine, Spark state in the streaming operator). Processing must not depend on how a
key's events are split into calls.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass
class ProcessResult:
    """What one call produced for one key.

    Attributes
    ----------
    state:
        The key's new state, or ``None`` when nothing is left to remember (the caller may
        then drop the key's stored state).
    outputs:
        Match objects (JSON-ready dicts, same shape from every engine).
    dead_letters:
        ``{"reason": ..., "event": ..., ...}`` dicts for events that could not be processed.
    next_timer_ms:
        Event times at which :meth:`KeyedProcessor.on_timer` must be called for this key
        (window expiry, pending absences); the caller registers them as event-time timers.
    """

    state: bytes | None
    outputs: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    next_timer_ms: list[int] = field(default_factory=list)


class KeyedProcessor(Protocol):
    """Processes the events of one partition key against shared, immutable compiled logic."""

    def key_of(self, event: Mapping[str, Any]) -> tuple | None:
        """The partition key of a raw event, or ``None`` when the event has no key."""

    def process(
        self,
        key: tuple,
        state: bytes | None,
        events: Sequence[Mapping[str, Any]],
        watermark_ms: int | None,
    ) -> ProcessResult:
        """Feed a key's events (any order; the processor sorts by event time, then input
        position) and advance the key to ``watermark_ms``."""

    def on_timer(
        self, key: tuple, state: bytes | None, timer_ms: int, watermark_ms: int
    ) -> ProcessResult:
        """Advance the key to the watermark because a registered timer fired."""
