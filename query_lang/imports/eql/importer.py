"""EQL files to one Vigil file: read each file (a bare query, or an Elastic detection rule in
TOML), translate its query, and declare the streams the rules read.

Event categories map to streams of the same name (``process where`` reads stream
``process``), unless ``streams`` maps them elsewhere; ``any`` reads every stream of the
output (or ``any_streams``). Each stream declares the fields its rules read, typed by a schema
or by their use (:class:`~query_lang.imports.eql.expressions.FieldTypes`), and the time field.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from query_lang.ast import Span
from query_lang.imports.eql.errors import EqlImportError
from query_lang.imports.eql.expressions import FieldTypes
from query_lang.imports.eql.reading import DIALECTS, ParsedQuery, parse_eql
from query_lang.imports.eql.rules import (
    ImportedRule,
    RuleHeader,
    infer_step_types,
    query_steps,
    write_rule,
)

__all__ = ["EqlImport", "EqlOptions", "EqlSource", "import_eql", "read_sources"]

_SEVERITIES = ("low", "medium", "high", "critical")
_BLOCK_WORDS = frozenset("rule query metric stream list webhook include".split())


@dataclass(frozen=True)
class EqlOptions:
    """How EQL is read and what the emitted streams look like.

    Attributes
    ----------
    dialect
        ``"elasticsearch"`` (default) or ``"classic"`` (the ``eql`` package's language).
    case_sensitive
        ``classic`` only: compare strings exactly, as the original engine's case-sensitive
        mode did (the ``eql`` package's Python engine ignores case).
    streams
        Event category -> Vigil stream name (default: the category).
    any_streams
        The streams ``any where`` reads (default: every stream of the output).
    schema
        Stream -> field -> Vigil type (``string int float bool``); ``"*"`` for every stream.
    time_field, time_unit
        The event-time field every stream declares (``timestamp``), and ``unit`` for epoch
        numbers (``s`` or ``ms``; ``None`` for ISO-8601 text or epoch seconds).
    id_field, lateness
        A stream's ``id`` field and ``lateness`` (``None``: Vigil's defaults).
    ignore_pipes
        Pipes dropped with a comment instead of refused (an explicit choice: the rule then
        reports every match the pipe would have cut).
    """

    dialect: str = "elasticsearch"
    case_sensitive: bool = False
    streams: Mapping[str, str] = field(default_factory=dict)
    any_streams: tuple[str, ...] = ()
    schema: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    time_field: str = "timestamp"
    time_unit: str | None = None
    id_field: str | None = None
    lateness: str | None = None
    ignore_pipes: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.dialect not in DIALECTS:
            raise ValueError(f"unknown EQL dialect {self.dialect!r}: {', '.join(DIALECTS)}")
        if self.case_sensitive and self.dialect != "classic":
            raise ValueError("case_sensitive is for the classic dialect; Elasticsearch's EQL "
                             "says per operator (`==` exact, `:` and `~` ignore case)")


@dataclass(frozen=True)
class EqlSource:
    """One EQL query and where it came from."""

    path: str
    query: str
    line_offset: int = 0
    name: str | None = None
    severity: str | None = None
    risk_score: Any = None
    rule_id: str | None = None
    file_text: str = ""


@dataclass
class EqlImport:
    """The result of an import: the Vigil text, and the refusals (one per query)."""

    text: str
    rules: list[ImportedRule]
    errors: list[EqlImportError]


def read_sources(paths: Iterable[str]) -> tuple[list[EqlSource], list[EqlImportError]]:
    """The queries of EQL files: a ``.toml`` file is an Elastic detection rule (``[rule]``
    with ``query``, ``name``, ``severity``, ``risk_score``), any other file one bare query."""
    sources, errors = [], []
    for path in paths:
        try:
            with open(path, encoding="utf-8") as handle:
                text = handle.read()
        except (OSError, UnicodeDecodeError) as err:
            errors.append(
                EqlImportError(f"cannot read {path}: {err}", Span(path), construct="file")
            )
            continue
        if path.endswith(".toml"):
            try:
                sources.append(_toml_source(path, text))
            except EqlImportError as err:
                errors.append(err)
        else:
            sources.append(EqlSource(path, text, 0, file_text=text))
    return sources, errors


def _toml_source(path: str, text: str) -> EqlSource:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise EqlImportError(f"not TOML: {err}", Span(path, 1, 1), text, construct="file") from None
    rule = document.get("rule")
    if not isinstance(rule, dict) or not isinstance(rule.get("query"), str):
        raise EqlImportError("a detection rule file needs [rule] with a query", Span(path, 1, 1),
                             text, construct="file")
    language = rule.get("language", "eql")
    if language != "eql":
        raise EqlImportError(f"rule language is {language!r}, not EQL", Span(path, 1, 1), text,
                             construct="language")
    query = rule["query"]
    return EqlSource(
        path, query, _line_offset(text, query), name=rule.get("name"),
        severity=rule.get("severity"), risk_score=rule.get("risk_score"),
        rule_id=rule.get("rule_id"), file_text=text,
    )


def _line_offset(file_text: str, query: str) -> int:
    """Lines before the query's text in its file (0 when the text was escaped beyond
    recognition: positions are then within the query)."""
    at = file_text.find(query.strip("\n")) if query.strip() else -1
    return file_text.count("\n", 0, at) if at >= 0 else 0


def _slug(text: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").lower() or "eql"
    return "_" + slug if slug[0].isdigit() or slug in _BLOCK_WORDS else slug


def import_eql(sources: Iterable[EqlSource], options: EqlOptions = EqlOptions()) -> EqlImport:
    """Translate ``sources`` into one Vigil file; a query without an exact equivalent is an
    error in ``errors`` (the others are still translated).

    Examples
    --------
    >>> result = import_eql([EqlSource("q.eql", 'process where process.name : "cmd.exe"')])
    >>> print(result.text)  # doctest: +NORMALIZE_WHITESPACE
    # Imported by `vigil import eql` (dialect elasticsearch) from: q.eql
    # Event categories read as streams: process -> process
    stream process (
      process_name string,
      timestamp timestamp
    ) time timestamp
    <BLANKLINE>
    # from q.eql
    rule q
      from process
      pattern e
      define e as lower(process_name) == "cmd.exe"
    <BLANKLINE>
    """
    sources = list(sources)
    errors: list[EqlImportError] = []
    parsed: list[tuple[EqlSource, ParsedQuery]] = []
    for source in sources:
        try:
            parsed.append((source, parse_eql(
                source.query, dialect=options.dialect, file=source.path,
                line_offset=source.line_offset,
            )))
        except EqlImportError as err:
            errors.append(_with_file_text(err, source))
    categories: list[str] = []
    for _, p in parsed:
        for category in _categories(p.query):
            if category != "any" and category not in categories:
                categories.append(category)
    stream_names = {c: options.streams.get(c, c) for c in categories}
    any_streams = list(options.any_streams) or list(dict.fromkeys(stream_names.values()))

    def streams_of(category: str) -> list[str]:
        if category == "any":
            if not any_streams:
                raise ValueError("`any where` reads every stream, and this import declares "
                                 "none: name them (--any-streams)")
            return any_streams
        name = stream_names.get(category, category)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) or name.lower() in _BLOCK_WORDS:
            raise ValueError(f"event category `{category}` is not a Vigil stream name: map it "
                             "(--stream CATEGORY=NAME)")
        return [name]

    types = FieldTypes(options.schema)
    planned = []
    for source, p in parsed:
        try:
            steps, filters, maxspan, notes, unique = query_steps(p, streams_of,
                                                                 options.ignore_pipes)
            infer_step_types(p, steps, filters, types, unique)
            planned.append((source, p, steps, filters, maxspan, notes, unique))
        except EqlImportError as err:
            errors.append(_with_file_text(err, source))
    rules: list[ImportedRule] = []
    used_names: set[str] = set()
    for source, p, steps, filters, maxspan, notes, unique in planned:
        header = _header(source, used_names)
        try:
            rule = write_rule(p, header, steps, filters, maxspan, notes, types,
                              _case_rule(p, options), _folds_keys(options), unique)
        except EqlImportError as err:
            errors.append(_with_file_text(err, source))
            continue
        used_names.add(header.name)
        rule.text = f"# from {source.path}\n" + rule.text
        rules.append(rule)
    text = _program_text(sources, rules, types, options, stream_names)
    return EqlImport(text, rules, errors)


def _with_file_text(err: EqlImportError, source: EqlSource) -> EqlImportError:
    if source.file_text and source.line_offset:
        err.source = source.file_text
    return err


def _categories(query: Any) -> list[str]:
    first = query.first
    if hasattr(first, "event_type"):
        return [first.event_type]
    found = [sub.query.event_type for sub in getattr(first, "queries", [])]
    close = getattr(first, "close", None)
    if close is not None:
        found.append(close.query.event_type)
    return found


def _case_rule(parsed: ParsedQuery, options: EqlOptions):
    if options.dialect == "classic":
        insensitive = not options.case_sensitive
        return lambda node: insensitive
    operators = parsed.operator_of

    def elasticsearch(node: Any) -> bool:
        written = operators.get(id(node), "")
        return written == ":" or written.endswith("~")

    return elasticsearch


def _folds_keys(options: EqlOptions) -> bool:
    # The package's engine folds the case of string join keys; Elasticsearch's does not.
    return options.dialect == "classic" and not options.case_sensitive


def _header(source: EqlSource, used: set[str]) -> RuleHeader:
    base = _slug(source.name or os.path.splitext(os.path.basename(source.path))[0])
    name, n = base, 1
    while name in used:
        n += 1
        name = f"{base}_{n}"
    severity = source.severity.lower() if isinstance(source.severity, str) else None
    tags = []
    if source.rule_id:
        tags.append(f"rule_id:{source.rule_id}")
    if source.risk_score is not None:
        tags.append(f"risk_score:{source.risk_score}")
    return RuleHeader(
        name, source.name, severity if severity in _SEVERITIES else None, tuple(tags)
    )


def _program_text(sources, rules, types: FieldTypes, options: EqlOptions, stream_names) -> str:
    origin = ", ".join(s.path for s in sources) or "(no files)"
    lines = [f"# Imported by `vigil import eql` (dialect {options.dialect}"
             + (", case-sensitive" if options.case_sensitive else "") + f") from: {origin}"]
    if stream_names:
        mapping = ", ".join(f"{c} -> {s}" for c, s in stream_names.items())
        lines.append(f"# Event categories read as streams: {mapping}")
    streams: dict[str, set[str]] = {}
    for rule in rules:
        for stream, names in rule.fields.items():
            streams.setdefault(stream, set()).update(names)
    for stream in sorted(streams):
        names = sorted(streams[stream] - {options.time_field, options.id_field})
        declared = [f"  {n} {types.of(stream, n)}" for n in names]
        if options.id_field:
            declared.append(f"  {options.id_field} {types.of(stream, options.id_field)}")
        declared.append(f"  {options.time_field} timestamp")
        tail = f") time {options.time_field}"
        if options.time_unit:
            tail += f" unit {options.time_unit}"
        if options.lateness:
            tail += f" lateness {options.lateness}"
        if options.id_field:
            tail += f" id {options.id_field}"
        lines.append(f"stream {stream} (\n" + ",\n".join(declared) + f"\n{tail}")
    text = "\n".join(lines) + "\n"
    for rule in rules:
        text += "\n" + rule.text
    return text
