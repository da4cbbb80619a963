"""The Vigil text the Sigma importer writes: a block per converted rule (a comment naming its
source, then the declaration) and the stream declarations the blocks need, with the fields they
read."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from query_lang.imports.sigma.logsources import LogSourceMap, StreamSpec
from query_lang.imports.sigma.values import string_literal

__all__ = [
    "SEVERITY", "Block", "Detection", "alert_clauses", "render_file", "rule_block",
    "rule_header", "rule_origin",
]

SEVERITY = {
    "informational": "low", "low": "low", "medium": "medium", "high": "high",
    "critical": "critical",
}
"""Sigma's ``level`` -> Vigil's ``severity``: ``informational`` has no level of its own in Vigil
and becomes ``low`` (the header comment keeps the original)."""


@dataclass(frozen=True)
class Detection:
    """One converted condition of a Sigma rule: the expression an event must satisfy.

    Attributes
    ----------
    stream:
        The stream of the rule's log source.
    condition:
        The Vigil expression.
    fields:
        Fields it reads: Vigil name -> Sigma name.
    """

    stream: StreamSpec
    condition: str
    fields: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Block:
    """A declaration of the output file and what it needs.

    Attributes
    ----------
    name:
        The declaration's name.
    text:
        Its text, comments first.
    reads:
        Stream name -> (its spec, the fields read from it).
    detection:
        For a detection rule, its converted condition (correlation rules read it).
    origin:
        The Sigma rule file it came from.
    """

    name: str
    text: str
    reads: Mapping[str, tuple[StreamSpec, frozenset[str]]]
    detection: Detection | None = None
    origin: str | None = None


def rule_header(rule: Any) -> list[str]:
    """Comment lines naming a Sigma rule: title, file, id, level, status, author, references."""
    source = rule.source.path.name if rule.source is not None else "<text>"
    lines = [f"Sigma: {rule.title} ({source})"]
    facts = [
        ("id", rule.id), ("status", rule.status and rule.status.name.lower()),
        ("level", rule.level and rule.level.name.lower()), ("author", rule.author),
        ("date", rule.date),
    ]
    info = ", ".join(f"{key} {value}" for key, value in facts if value)
    if info:
        lines.append(info)
    for reference in getattr(rule, "references", None) or ():
        lines.append(f"reference: {reference}")
    for false_positive in getattr(rule, "falsepositives", None) or ():
        lines.append(f"false positive: {false_positive}")
    return ["# " + " ".join(line.split()) for line in lines]


def alert_clauses(rule: Any) -> list[str]:
    """The ``severity`` and ``tags`` clauses of a Sigma rule."""
    clauses = []
    level = getattr(rule, "level", None)
    if level is not None:
        clauses.append(f"severity {SEVERITY[level.name.lower()]}")
    tags = [str(tag) for tag in getattr(rule, "tags", None) or ()]
    if tags:
        clauses.append("tags " + ", ".join(string_literal(tag) for tag in tags))
    return clauses


def top_level_operands(condition: str, op: str = "or") -> list[str]:
    """The operands of ``condition``'s top-level ``or`` (or ``and``), to print one per line
    (strings and regular-expression literals are skipped over, so an ``or`` inside stays).

    Examples
    --------
    >>> top_level_operands('a == "x or y" or (b or c) or d matches / or /')
    ['a == "x or y"', '(b or c)', 'd matches / or /']
    """
    token = f" {op} "
    parts, depth, start, i = [], 0, 0, 0
    while i < len(condition):
        ch = condition[i]
        if ch == '"':
            i += 1
            while i < len(condition) and condition[i] != '"':
                i += 2 if condition[i] == "\\" else 1
        elif ch == "/" and condition[max(0, i - 8):i] == "matches ":
            i += 1
            while i < len(condition) and condition[i] != "/":
                i += 2 if condition[i] == "\\" else 1
        elif ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif depth == 0 and condition.startswith(token, i):
            parts.append(condition[start:i])
            start = i + len(token)
            i += len(token) - 1
        i += 1
    parts.append(condition[start:])
    return parts


def _wrapped(condition: str) -> str:
    """A long condition one top-level operand a line (``or`` first, else ``and``)."""
    if len(condition) <= 80:
        return condition
    for op in ("or", "and"):
        operands = top_level_operands(condition, op)
        if len(operands) > 1:
            return f"\n{' ' * 10}{op} ".join(operands)
    return condition


def rule_block(rule: Any, detection: Detection, name: str, mapping: LogSourceMap) -> Block:
    """A single-event Vigil rule for a converted Sigma condition."""
    lines = rule_header(rule)
    title = f" {string_literal(rule.title)}" if rule.title else ""
    lines.append(f"rule {name}{title}")
    lines.append(f"  from {detection.stream.name}")
    lines.append("  pattern e")
    lines.append("  define e as " + _wrapped(detection.condition))
    lines.extend("  " + clause for clause in alert_clauses(rule))
    reads = {detection.stream.name: (detection.stream, frozenset(detection.fields))}
    return Block(name, "\n".join(lines), reads, detection, rule_origin(rule))


def rule_origin(rule: Any) -> str | None:
    """The file a Sigma rule was read from, if any."""
    return str(rule.source.path) if rule.source is not None else None


_BLOCK_KEYWORDS = frozenset({"include", "stream", "list", "webhook", "rule", "query", "metric"})


def _stream_declaration(spec: StreamSpec, fields: Iterable[str], mapping: LogSourceMap) -> str:
    names = [mapping.time_field, *sorted(set(fields) - {mapping.time_field})]
    types = [
        "timestamp" if name == mapping.time_field else spec.field_type(name) for name in names
    ]
    lines: list[str] = []
    for name, kind in zip(names, types, strict=True):
        if name.lower() in _BLOCK_KEYWORDS:
            # A line that starts with `query NAME` starts a new block to the parser's error
            # recovery: keep such a field on the line before.
            lines[-1] += f", {name} {kind}"
        else:
            lines.append(f"  {name} {kind}")
    body = ",\n".join(lines)
    source = ", ".join(f"{key}: {value}" for key, value in zip(
        ("product", "category", "service"), spec.logsource, strict=True) if value)
    return (
        f"# Sigma log source {source}\n"
        f"stream {spec.name} (\n{body}\n) time {mapping.time_field} lateness {mapping.lateness}"
    )


def render_file(blocks: Sequence[Block], mapping: LogSourceMap) -> str:
    """A whole Vigil file: the streams the blocks read (each with every field any block reads
    from it), then the blocks."""
    streams: dict[str, tuple[StreamSpec, set[str]]] = {}
    for block in blocks:
        for name, (spec, fields) in block.reads.items():
            streams.setdefault(name, (spec, set()))[1].update(fields)
    parts = ["# Imported from Sigma by `vigil import sigma`."]
    parts += [_stream_declaration(spec, fields, mapping) for spec, fields in streams.values()]
    parts += [block.text for block in blocks]
    return "\n\n".join(parts) + "\n"
