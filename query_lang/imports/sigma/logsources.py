"""Sigma log sources as Vigil streams: which stream a rule's ``logsource`` reads, the types its
fields are declared with, and which Windows event-log records belong to it.

The importer and the evtx converter both read this one mapping, so the events the converter
writes always fit the streams the importer declares. The default is ``logsources.yml`` beside
this module; a YAML file of the same form overrides or extends it entry by entry.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources
from types import MappingProxyType
from typing import Any

import yaml

from query_lang.imports.sigma.errors import SigmaImportError
from query_lang.lexical import duration_ms

__all__ = [
    "DEFAULT_MAPPING",
    "EvtxSelector",
    "LogSource",
    "LogSourceMap",
    "StreamSpec",
    "vigil_name",
]

DEFAULT_MAPPING = "logsources.yml"
"""The default mapping's file name, package data of :mod:`query_lang.imports.sigma`."""

FIELD_TYPES = frozenset({"string", "int", "float", "bool"})
"""Types a mapping may declare a field with; every other field is a ``string``."""

LogSource = tuple[str | None, str | None, str | None]
"""A Sigma log source: ``(product, category, service)``, ``None`` where the rule names none."""

_NOT_NAME = re.compile(r"[^A-Za-z0-9_]")
_LITERAL_WORDS = frozenset({"true", "false", "not"})


def vigil_name(text: str) -> str:
    """``text`` as a Vigil name: every character outside ``[A-Za-z0-9_]`` becomes ``_``, and a
    leading digit gets a ``_`` before it.

    Sigma field names may hold dots, dashes and spaces (``cs-uri-query``, ``id.resp_p``); the
    converter writes event fields under the same names, so rules and events agree.

    Examples
    --------
    >>> vigil_name("cs-uri-query"), vigil_name("id.resp_p"), vigil_name("3rd party")
    ('cs_uri_query', 'id_resp_p', '_3rd_party')
    """
    name = _NOT_NAME.sub("_", text) or "_"
    if name.lower() in _LITERAL_WORDS:
        return name + "_"  # `true`, `false` and `not` read as the language's words
    return "_" + name if name[0].isdigit() else name


@dataclass(frozen=True)
class EvtxSelector:
    """Which Windows event-log records belong to a stream: a channel, optionally some event
    ids, optionally required values of event-data fields (``EventType: [CreateKey]``)."""

    channel: str
    event_ids: frozenset[int] | None = None
    fields: Mapping[str, frozenset[str]] = field(default_factory=dict)

    def selects(self, channel: str, event_id: int | None, data: Mapping[str, Any]) -> bool:
        """Whether a record of ``channel`` with ``event_id`` and event data ``data`` belongs."""
        if channel.lower() != self.channel.lower():
            return False
        if self.event_ids is not None and event_id not in self.event_ids:
            return False
        return all(str(data.get(name)) in allowed for name, allowed in self.fields.items())


@dataclass(frozen=True)
class StreamSpec:
    """The stream of one log source.

    Attributes
    ----------
    name:
        The stream's name in Vigil.
    logsource:
        The Sigma log source it stands for.
    evtx:
        The Windows event-log records that are its events (empty: none known).
    field_types:
        Declared types of the fields that are not strings.
    keywords:
        The field keyword searches (Sigma values without a field) look in, if any.
    renames:
        Sigma field name -> the field the stream's events hold it in (the pipeline's field
        mapping, for events that name fields otherwise than Sigma's taxonomy).
    """

    name: str
    logsource: LogSource
    evtx: tuple[EvtxSelector, ...] = ()
    field_types: Mapping[str, str] = field(default_factory=dict)
    keywords: str | None = None
    renames: Mapping[str, str] = field(default_factory=dict)

    def field_type(self, name: str) -> str:
        """The declared type of field ``name`` (a Vigil name): ``string`` unless mapped."""
        return self.field_types.get(name, "string")


@dataclass(frozen=True)
class LogSourceMap:
    """The mapping from Sigma log sources to Vigil streams.

    Attributes
    ----------
    time_field:
        The event-time field every stream declares (``timestamp``), written by the converter.
    lateness:
        The ``lateness`` every stream declares (a duration such as ``1m``).
    streams:
        The mapped log sources, in the order of the mapping files.
    placeholders:
        Values of ``%name%`` placeholders, which Sigma's ``|expand`` modifier replaces.

    Examples
    --------
    >>> mapping = LogSourceMap.default()
    >>> mapping.stream_for(("windows", "process_creation", None)).name
    'windows_process_creation'
    >>> mapping.stream_for(("aws", None, "cloudtrail")).name  # not mapped: named after its parts
    'aws_cloudtrail'
    """

    time_field: str = "event_time"
    lateness: str = "1m"
    streams: tuple[StreamSpec, ...] = ()
    placeholders: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def default(cls) -> LogSourceMap:
        """The mapping shipped with Vigil (``logsources.yml``)."""
        text = resources.files(__package__).joinpath(DEFAULT_MAPPING).read_text("utf-8")
        return cls.from_yaml(text, DEFAULT_MAPPING)

    @classmethod
    def load(cls, paths: Sequence[str] = ()) -> LogSourceMap:
        """The default mapping with the files ``paths`` applied over it, in order."""
        mapping = cls.default()
        for path in paths:
            try:
                with open(path, encoding="utf-8") as handle:
                    text = handle.read()
            except OSError as err:
                raise SigmaImportError(f"cannot read the mapping: {err.strerror}", path) from None
            mapping = mapping.merged(cls.from_yaml(text, path, base=mapping))
        return mapping

    @classmethod
    def from_yaml(cls, text: str, origin: str, base: LogSourceMap | None = None) -> LogSourceMap:
        """Read a mapping file's text; ``origin`` names it in errors."""
        try:
            data = yaml.safe_load(text) or {}
        except yaml.YAMLError as err:
            raise SigmaImportError(f"the mapping is not valid YAML: {err}", origin) from None
        if not isinstance(data, dict):
            raise SigmaImportError("the mapping must be a YAML mapping", origin)
        base = base or cls()
        lateness = str(data.get("lateness", base.lateness))
        try:
            duration_ms(lateness)
        except ValueError:
            raise SigmaImportError(
                f"lateness {lateness!r} is not a duration such as 1m", origin
            ) from None
        placeholders = {
            str(name): tuple(str(v) for v in (values if isinstance(values, list) else [values]))
            for name, values in (data.get("placeholders") or {}).items()
        }
        return cls(
            time_field=vigil_name(str(data.get("time_field", base.time_field))),
            lateness=lateness,
            streams=tuple(_stream_spec(entry, origin) for entry in data.get("streams") or ()),
            placeholders=MappingProxyType(placeholders),
        )

    def merged(self, override: LogSourceMap) -> LogSourceMap:
        """This mapping with ``override``'s entries replacing those of the same log source."""
        replaced = {spec.logsource for spec in override.streams}
        kept = tuple(spec for spec in self.streams if spec.logsource not in replaced)
        return LogSourceMap(
            time_field=override.time_field,
            lateness=override.lateness,
            streams=kept + override.streams,
            placeholders=MappingProxyType({**self.placeholders, **override.placeholders}),
        )

    def stream_for(self, logsource: LogSource) -> StreamSpec:
        """The stream of a rule's log source; one named after its parts when none is mapped."""
        for spec in self.streams:
            if spec.logsource == logsource:
                return spec
        parts = [part for part in logsource if part]
        if not parts:
            return StreamSpec("events", logsource)
        return StreamSpec(vigil_name("_".join(parts)).lower(), logsource)

    def evtx_streams(
        self, channel: str, event_id: int | None, data: Mapping[str, Any]
    ) -> list[StreamSpec]:
        """The streams a Windows event-log record belongs to (several: a Sysmon process
        creation is an event of ``windows_process_creation`` and of ``windows_sysmon``)."""
        return [
            spec for spec in self.streams
            if any(selector.selects(channel, event_id, data) for selector in spec.evtx)
        ]


def _stream_spec(entry: Any, origin: str) -> StreamSpec:
    if not isinstance(entry, dict) or not isinstance(entry.get("logsource"), dict):
        raise SigmaImportError(f"a stream entry needs a `logsource` mapping: {entry!r}", origin)
    source = entry["logsource"]
    logsource = tuple(
        str(source[key]) if source.get(key) is not None else None
        for key in ("product", "category", "service")
    )
    name = entry.get("stream")
    if not isinstance(name, str) or vigil_name(name) != name:
        raise SigmaImportError(f"stream name {name!r} is not a Vigil name", origin)
    field_types = {}
    for field_name, type_name in (entry.get("fields") or {}).items():
        if type_name not in FIELD_TYPES:
            raise SigmaImportError(
                f"field {field_name!r}: type {type_name!r} is not one of "
                f"{', '.join(sorted(FIELD_TYPES))}",
                origin,
            )
        field_types[vigil_name(str(field_name))] = type_name
    selectors = []
    for selector in entry.get("evtx") or ():
        if not isinstance(selector, dict) or "channel" not in selector:
            raise SigmaImportError(f"an evtx selector needs a `channel`: {selector!r}", origin)
        ids = selector.get("event_ids")
        selectors.append(EvtxSelector(
            channel=str(selector["channel"]),
            event_ids=frozenset(int(i) for i in ids) if ids is not None else None,
            fields=MappingProxyType({
                str(k): frozenset(str(v) for v in (vs if isinstance(vs, list) else [vs]))
                for k, vs in (selector.get("fields") or {}).items()
            }),
        ))
    keywords = entry.get("keywords")
    return StreamSpec(
        name=name,
        logsource=logsource,  # type: ignore[arg-type]
        evtx=tuple(selectors),
        field_types=MappingProxyType(field_types),
        keywords=vigil_name(str(keywords)) if keywords else None,
        renames=MappingProxyType(
            {str(k): str(v) for k, v in (entry.get("rename") or {}).items()}
        ),
    )
