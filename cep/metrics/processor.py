"""Per-group processing of ``metric`` blocks: the :class:`cep.events.KeyedProcessor` that runs a
metric's window operator inside the Spark operator.

The embedded engine runs one :class:`~cep.metrics.MetricOperator` per metric over all its
groups. Every window, aggregate and ``seen`` history belongs to one ``by`` group, so the same
operator restricted to one group gives that group's rows exactly; :class:`MetricProcessor`
partitions a metric by its ``by`` values and stores each group's operator as
:meth:`~cep.metrics.MetricOperator.to_bytes` between calls, like a rule's key state.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from cep.events.event import (
    SEQ_FIELD,
    STREAM_FIELD,
    Event,
    StreamSchema,
)
from cep.events.keyed import KeyedProcessorBase, ProcessResult, late_letter, validate_raw
from cep.metrics.compiler import CompiledMetric
from cep.metrics.operator import MetricOperator
from query_lang.ast import StreamDecl
from query_lang.compiler import normalise_value

__all__ = ["MetricProcessor"]


class MetricProcessor(KeyedProcessorBase):
    """Runs one compiled metric, one ``by`` group at a time.

    The key of an event is the tuple of its ``by`` values (``()`` for a metric without ``by``,
    which is then a single group); a null ``by`` value is a group of its own, as in the
    embedded engine. Events behind the watermark are not dropped: they go to
    :meth:`MetricOperator.late`, which corrects the windows it still retains (rows flagged
    ``"final": false``) or refuses them (a ``late`` dead letter).

    Parameters
    ----------
    metric:
        The metric, from :func:`cep.metrics.compile_metric`.
    streams:
        Stream name -> declaration (or prepared :class:`StreamSchema`), for validating raw events.
    lateness_ms:
        Overrides every stream's declared lateness when given.
    """

    handles_late = True
    """The caller hands events behind the watermark to :meth:`process` (for corrections)."""

    def __init__(
        self,
        metric: CompiledMetric,
        streams: Mapping[str, StreamDecl | StreamSchema],
        *,
        lateness_ms: int | None = None,
    ) -> None:
        self.metric = metric
        self.streams = frozenset(metric.decl.streams)
        self.key_fields: dict[str, tuple[str, ...]] = {s: metric.by for s in self.streams}
        self.schemas: dict[str, StreamSchema] = {
            name: decl
            if isinstance(decl, StreamSchema)
            else StreamSchema.from_decl(decl, lateness_ms=lateness_ms)
            for name, decl in streams.items()
        }

    @property
    def name(self) -> str:
        return self.metric.name

    def wants(self, stream: str) -> bool:
        """Whether the metric reads events of ``stream``."""
        return stream in self.streams

    def key_of(self, event: Mapping[str, Any]) -> tuple | None:
        """The group of a raw event (its ``by`` values), or ``None`` for another stream's."""
        if event.get(STREAM_FIELD) not in self.streams:
            return None
        return tuple(normalise_value(event.get(name)) for name in self.metric.by)

    def process(
        self,
        key: tuple,
        state: bytes | None,
        events: Sequence[Mapping[str, Any]],
        watermark_ms: int | None,
    ) -> ProcessResult:
        """Move the group to ``watermark_ms`` (windows whose end it passed emit their final
        rows), then absorb its events in ``(time, input position)`` order: those at or after
        the watermark into the open windows, older ones as corrections or ``late`` dead
        letters.

        ``events`` are dicts of the stream's fields plus ``stream`` and ``_seq`` (the input
        position), in any order. ``None`` as watermark keeps the group's own.
        """
        operator = self._load(state)
        outputs: list[dict[str, Any]] = []
        dead: list[dict[str, Any]] = []
        if watermark_ms is not None and watermark_ms > operator.watermark:
            outputs.extend(operator.advance_watermark(watermark_ms))
        accepted: list[tuple[Event, Mapping[str, Any]]] = []
        for raw in events:
            event = validate_raw(raw, self.schemas, dead, "MetricProcessor")
            if event is not None:
                accepted.append((event, raw))
        accepted.sort(key=lambda pair: (pair[0].ts, pair[0].seq))
        for event, raw in accepted:
            self._absorb(operator, event, raw, outputs, dead)
        return self._result(operator, outputs, dead)

    def replay(
        self,
        key: tuple,
        events: Sequence[Mapping[str, Any]],
        arrival_watermarks: Sequence[int | None],
        final_watermark_ms: int,
    ) -> ProcessResult:
        """Run a group's complete input as the embedded engine reading it would: in input
        order, each event meeting the watermark that stood when it arrived (``None``: none
        yet), then to ``final_watermark_ms``. Late events correct retained windows or become
        ``late`` dead letters exactly as they do there. The backtest path of the Spark operator.
        """
        operator = MetricOperator(self.metric)
        outputs: list[dict[str, Any]] = []
        dead: list[dict[str, Any]] = []
        order = sorted(range(len(events)), key=lambda i: events[i].get(SEQ_FIELD))
        for i in order:
            arrival = arrival_watermarks[i]
            if arrival is not None and arrival > operator.watermark:
                outputs.extend(operator.advance_watermark(arrival))
            event = validate_raw(events[i], self.schemas, dead, "MetricProcessor")
            if event is not None:
                self._absorb(operator, event, events[i], outputs, dead)
        outputs.extend(operator.advance_watermark(final_watermark_ms))
        return self._result(operator, outputs, dead)

    # ------------------------------------------------------------------ helpers

    def _absorb(
        self,
        operator: MetricOperator,
        event: Event,
        raw: Mapping[str, Any],
        outputs: list[dict[str, Any]],
        dead: list[dict[str, Any]],
    ) -> None:
        if event.ts >= operator.watermark:
            outputs.extend(operator.process(event.fields, event.ts))
            return
        corrections = operator.late(event.fields, event.ts, operator.watermark)
        if corrections is None:
            unit = self.schemas[event.stream].epoch_unit_ms
            dead.append(late_letter(event, operator.watermark, raw, unit))
        else:
            outputs.extend(corrections)

    def _load(self, state: bytes | None) -> MetricOperator:
        if not state:
            return MetricOperator(self.metric)
        return MetricOperator.from_bytes(self.metric, state)

    def _result(
        self, operator: MetricOperator, outputs: list[dict[str, Any]], dead: list[dict[str, Any]]
    ) -> ProcessResult:
        due = operator.next_due_ms
        if due is not None and due <= operator.watermark:
            outputs.extend(operator.advance_watermark(operator.watermark))
            due = operator.next_due_ms
        empty = operator.is_empty
        return ProcessResult(
            state=None if empty else operator.to_bytes(),
            outputs=outputs,
            dead_letters=dead,
            next_timer_ms=[] if due is None or empty else [due],
        )
