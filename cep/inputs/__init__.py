"""The embedded engine's inputs: files, directories, stdin and Redis Streams read as chunks of
events parsed column-wise, endless when followed (a followed file or directory wakes on
inotify), each able to say where it stands (a cursor) and to start again from there."""

from __future__ import annotations

from cep.inputs.chunks import CHUNK_ROWS, IDLE, Chunk, Segment, chunked
from cep.inputs.columns import EventBatch, LineParser, Piece, parse_line
from cep.inputs.event_input import REDIS_SCHEMES, EventInput
from cep.inputs.files import DirectorySource, FileSource, StdinSource
from cep.inputs.lines import LineBlock, LineReader, LongLine
from cep.inputs.reading import InputReader, Step, open_source
from cep.inputs.redis_stream import RedisInputError, RedisSource, entry_text, split_stream_url
from cep.inputs.source import POLL_INTERVAL_S, Cursor, LineSource, StopSignal
from cep.inputs.watch import READ_INTERVAL_S, InotifyWatch, PollingWatch, Watch, open_watch

__all__ = [
    "CHUNK_ROWS",
    "IDLE",
    "POLL_INTERVAL_S",
    "READ_INTERVAL_S",
    "REDIS_SCHEMES",
    "Chunk",
    "Cursor",
    "DirectorySource",
    "EventBatch",
    "EventInput",
    "FileSource",
    "InotifyWatch",
    "InputReader",
    "LineBlock",
    "LineParser",
    "LineReader",
    "LineSource",
    "LongLine",
    "Piece",
    "PollingWatch",
    "RedisInputError",
    "RedisSource",
    "Segment",
    "StdinSource",
    "Step",
    "StopSignal",
    "Watch",
    "chunked",
    "entry_text",
    "open_watch",
    "open_source",
    "parse_line",
    "split_stream_url",
]
