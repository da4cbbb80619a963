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

from cep.events.event import (
    SEQ_FIELD,
    STREAM_FIELD,
    BadEventError,
    EngineError,
    Event,
    EventReason,
    StreamSchema,
    dead_letter,
    stream_of,
)
from cep.events.watermark import END_OF_INPUT, late_detail


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


class KeyedProcessorBase:
    """``on_timer`` and ``close`` written once, in terms of the subclass's ``process``: both are
    a call without events that moves the key to a later watermark, where ``process`` releases
    what that watermark allows (windows, absences, buffered events)."""

    def process(
        self,
        key: tuple,
        state: bytes | None,
        events: Sequence[Mapping[str, Any]],
        watermark_ms: int | None,
    ) -> ProcessResult:
        """Each processor's own: see :meth:`KeyedProcessor.process`."""
        raise NotImplementedError

    def on_timer(
        self, key: tuple, state: bytes | None, timer_ms: int, watermark_ms: int
    ) -> ProcessResult:
        """A registered timer fired: advance the key to the later of the timer and the watermark."""
        return self.process(key, state, (), max(timer_ms, watermark_ms))

    def close(self, key: tuple, state: bytes | None) -> ProcessResult:
        """End of input for the key: advance it to :data:`~cep.events.watermark.END_OF_INPUT`,
        so everything it holds is released or fired."""
        return self.process(key, state, (), END_OF_INPUT)


def validate_raw(
    raw: Mapping[str, Any],
    schemas: Mapping[str, StreamSchema],
    dead: list[dict[str, Any]],
    owner: str,
) -> Event | None:
    """Validate one raw event handed to a processor's ``process``: the event, or ``None`` after
    appending its dead letter (reason, detail, input position) to ``dead``.

    Raises
    ------
    EngineError
        When the event carries no int ``_seq`` (its input position): a caller's mistake, not
        bad input.
    """
    seq = raw.get(SEQ_FIELD)
    if not isinstance(seq, int) or isinstance(seq, bool):
        raise EngineError(
            f"raw events handed to {owner}.process need an int '{SEQ_FIELD}' field "
            f"(their input position); got {seq!r}"
        )
    try:
        schema = stream_of(raw, None, schemas)
        return schema.normalise(raw, seq=seq, position=seq)
    except BadEventError as exc:
        stream = raw.get(STREAM_FIELD)
        dead.append(
            dead_letter(
                exc.reason, exc.detail, line=seq,
                stream=stream if isinstance(stream, str) else None, event=raw,
            )
        )
        return None


def late_letter(
    event: Event,
    watermark: int,
    raw: Mapping[str, Any] | None = None,
    unit_ms: int | None = None,
) -> dict[str, Any]:
    """The ``late`` dead letter of an event behind ``watermark`` (``unit_ms``: its stream's
    unit of epoch numbers, for :func:`~cep.events.watermark.late_detail`'s unit hint)."""
    return dead_letter(
        EventReason.LATE,
        late_detail(event.ts, watermark, unit_ms),
        line=event.seq,
        stream=event.stream,
        event=raw if raw is not None else {**event.fields, STREAM_FIELD: event.stream},
    )
