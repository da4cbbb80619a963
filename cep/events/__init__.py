"""Events and their time: validation against a declared ``stream`` (bad input becomes a dead
letter), watermarks and reordering, column-wise intake, and the keyed-processor contract that
both engines drive."""

from __future__ import annotations

from cep.events.columnar import Block, Chunk, ColumnBuffer
from cep.events.event import (
    SEQ_FIELD,
    STREAM_FIELD,
    DeadLetter,
    Event,
    EventReason,
    StreamSchema,
    dead_letter,
    parse_json_line,
    parse_timestamp,
    plain_value,
    stream_of,
    time_column_ms,
)
from cep.events.keyed import (
    KeyedProcessor,
    KeyedProcessorBase,
    ProcessResult,
    late_letter,
    validate_raw,
)
from cep.events.watermark import END_OF_INPUT, NO_WATERMARK, ReorderBuffer, Watermark, iso_ms

__all__ = [
    "END_OF_INPUT",
    "NO_WATERMARK",
    "SEQ_FIELD",
    "STREAM_FIELD",
    "Block",
    "Chunk",
    "ColumnBuffer",
    "DeadLetter",
    "Event",
    "EventReason",
    "KeyedProcessor",
    "KeyedProcessorBase",
    "ProcessResult",
    "ReorderBuffer",
    "StreamSchema",
    "Watermark",
    "dead_letter",
    "iso_ms",
    "late_letter",
    "parse_json_line",
    "parse_timestamp",
    "plain_value",
    "stream_of",
    "time_column_ms",
    "validate_raw",
]
