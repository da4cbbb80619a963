"""Windows event logs in the JSON form ``evtx_dump`` writes (concatenated
``{"Event": {"System": ..., "EventData": ...}}`` objects, as in SigmaHQ's regression cases) as
Vigil events of the streams the Sigma importer maps those log sources to.

A record becomes one event per stream it belongs to (:meth:`LogSourceMap.evtx_streams`): its
``System`` values (``Provider.Name`` as ``Provider_Name``), its ``EventData`` (or ``UserData``)
values, and the stream's time field from ``TimeCreated.SystemTime``. Values are written as
strings, as the streams declare them, except fields the mapping declares ``int``, ``float`` or
``bool``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from query_lang.imports.sigma.errors import SigmaImportError
from query_lang.imports.sigma.logsources import LogSourceMap, StreamSpec, vigil_name
from query_lang.timestamps import parse_iso_ms

__all__ = ["EvtxConversion", "convert_evtx_json", "read_json_objects", "record_fields"]

_ATTRIBUTES = "#attributes"
_TEXT = "#text"


def read_json_objects(text: str, origin: str = "<input>") -> Iterator[Any]:
    """The JSON values of ``text``: concatenated objects (evtx_dump's output), JSON lines, or
    one array of them.

    Examples
    --------
    >>> list(read_json_objects('{"a": 1}\\n{"b": 2} [{"c": 3}]'))
    [{'a': 1}, {'b': 2}, {'c': 3}]
    """
    decoder = json.JSONDecoder()
    position = 0
    while True:
        while position < len(text) and text[position].isspace():
            position += 1
        if position >= len(text):
            return
        try:
            value, position = decoder.raw_decode(text, position)
        except json.JSONDecodeError as err:
            line = text.count("\n", 0, err.pos) + 1
            raise SigmaImportError(f"not JSON: {err.msg}", origin, line) from None
        if isinstance(value, list):
            yield from value
        else:
            yield value


def _scalar(value: Any) -> Any:
    """The value of an element: its text when it is an element with attributes."""
    if isinstance(value, dict):
        if _TEXT in value:
            return _scalar(value[_TEXT])
        return None
    if isinstance(value, list):
        items = [_scalar(v) for v in value]
        return "\n".join(str(v) for v in items if v is not None)
    return value


def _flatten(prefix: str, value: Any, out: dict[str, Any]) -> None:
    """Scalars of ``value`` under ``prefix``; attributes of an element as ``Element_Attr``."""
    if isinstance(value, dict) and _TEXT not in value:
        for key, item in value.items():
            if key == _ATTRIBUTES and isinstance(item, dict):
                for attr, attr_value in item.items():
                    if prefix:
                        out.setdefault(f"{prefix}_{attr}", _scalar(attr_value))
            elif key != _ATTRIBUTES:
                _flatten(f"{prefix}_{key}" if prefix else key, item, out)
        return
    if prefix:
        out.setdefault(prefix, _scalar(value))


def record_fields(record: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The fields of one ``{"Event": ...}`` record, and its ``TimeCreated`` time.

    Examples
    --------
    >>> record = {"Event": {"System": {"EventID": 1, "Channel": "Security",
    ...     "Provider": {"#attributes": {"Name": "Microsoft-Windows-Security-Auditing"}},
    ...     "TimeCreated": {"#attributes": {"SystemTime": "2024-05-01T10:00:00.5Z"}}},
    ...     "EventData": {"Image": "C:\\\\x.exe", "ProcessId": 42}}}
    >>> fields, time = record_fields(record)
    >>> fields["Provider_Name"], fields["ProcessId"], time
    ('Microsoft-Windows-Security-Auditing', 42, '2024-05-01T10:00:00.5Z')
    """
    event = record.get("Event", record)
    if not isinstance(event, Mapping):
        raise ValueError("a record is a JSON object with an `Event` object")
    system = event.get("System") or {}
    fields: dict[str, Any] = {}
    # Event data first: on a clash of names the event's own data wins over System's.
    for section in ("EventData", "UserData"):
        data = event.get(section)
        if isinstance(data, dict):
            if section == "UserData" and len(data) == 1:
                data = next(iter(data.values()))  # UserData wraps its values in one element
            if isinstance(data, dict):
                _flatten("", {k: v for k, v in data.items() if k != _ATTRIBUTES}, fields)
    time = None
    created = system.get("TimeCreated")
    if isinstance(created, dict):
        time = (created.get(_ATTRIBUTES) or {}).get("SystemTime")
    _flatten("", {k: v for k, v in system.items() if k != "TimeCreated"}, fields)
    return fields, time


def _typed(value: Any, kind: str) -> Any:
    """``value`` as a field of type ``kind``; ``None`` when it cannot be one."""
    if kind == "string":
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        return str(value)
    if kind == "bool":
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        return {"true": True, "false": False, "1": True, "0": False}.get(text)
    try:
        return int(str(value), 0) if kind == "int" else float(value)
    except (TypeError, ValueError):
        return None


@dataclass
class EvtxConversion:
    """Events converted from event-log records.

    Attributes
    ----------
    events:
        Vigil events (JSON objects with ``stream`` and the time field), in time order.
    records:
        Records read.
    unmapped:
        Records that belong to no mapped stream, by ``channel/event id``.
    dropped_values:
        Values left out because they do not read as the type the mapping declares.
    """

    events: list[dict[str, Any]] = field(default_factory=list)
    records: int = 0
    unmapped: dict[str, int] = field(default_factory=dict)
    dropped_values: int = 0


def convert_evtx_json(
    text: str, mapping: LogSourceMap | None = None, origin: str = "<input>"
) -> EvtxConversion:
    """Convert evtx JSON ``text`` into Vigil events of the mapped streams.

    Examples
    --------
    >>> text = '''{"Event": {"System": {"EventID": 1,
    ...   "Channel": "Microsoft-Windows-Sysmon/Operational",
    ...   "TimeCreated": {"#attributes": {"SystemTime": "2024-05-01T10:00:00Z"}}},
    ...   "EventData": {"Image": "C:\\\\\\\\Windows\\\\\\\\whoami.exe", "ProcessId": 42}}}'''
    >>> result = convert_evtx_json(text)
    >>> [(e["stream"], e["Image"], e["ProcessId"]) for e in result.events]
    [('windows_process_creation', 'C:\\\\Windows\\\\whoami.exe', '42'), \
('windows_sysmon', 'C:\\\\Windows\\\\whoami.exe', '42')]
    """
    mapping = mapping or LogSourceMap.default()
    result = EvtxConversion()
    timed: list[tuple[int, int, dict[str, Any]]] = []
    for record in read_json_objects(text, origin):
        if not isinstance(record, Mapping):
            raise SigmaImportError("a record is a JSON object with an `Event` object", origin)
        result.records += 1
        try:
            raw, time = record_fields(record)
        except ValueError as err:
            raise SigmaImportError(str(err), origin) from None
        ms = parse_iso_ms(str(time)) if time is not None else None
        if ms is None:
            raise SigmaImportError(
                f"record {result.records} has no System.TimeCreated.SystemTime time", origin)
        channel = str(raw.get("Channel", ""))
        event_id = _typed(raw.get("EventID"), "int")
        specs = mapping.evtx_streams(channel, event_id, raw)
        if not specs:
            key = f"{channel or '?'}/{event_id}"
            result.unmapped[key] = result.unmapped.get(key, 0) + 1
            continue
        for spec in specs:
            timed.append((ms, len(timed), _event(spec, raw, str(time), mapping, result)))
    timed.sort(key=lambda item: (item[0], item[1]))
    result.events = [event for _, _, event in timed]
    return result


def _event(
    spec: StreamSpec, raw: Mapping[str, Any], time: str, mapping: LogSourceMap,
    result: EvtxConversion,
) -> dict[str, Any]:
    event: dict[str, Any] = {"stream": spec.name, mapping.time_field: time}
    for key, value in raw.items():
        if value is None:
            continue
        name = vigil_name(key)
        if name in event:
            continue
        typed = _typed(value, spec.field_type(name))
        if typed is None:
            result.dropped_values += 1
            continue
        event[name] = typed
    return event
