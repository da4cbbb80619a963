"""Syntax tree to canonical text: ``parse(print_module(m)) == m`` for every parsed module.

The printer adds parentheses only where precedence needs them and leaves out clauses that hold
their default value, so the output is also the formatter's output. Expressions print through
:func:`query_lang.ast.print_expr` (an emit item is named by its expression's text, so that part
lives with the syntax tree) and tokens through :mod:`query_lang.lexical`; both re-exported here.
"""

from __future__ import annotations

import dataclasses
import re

from query_lang import ast
from query_lang.ast import print_duration, print_expr
from query_lang.lexical import quote, search_number

_SWORD = re.compile(r"[^\s:()\[\]{}\"'/+\-!<>=^~|&#][^\s:()\[\]{}\"'/<>=^~|&]*")
_SEARCH_KEYWORDS = {"AND", "OR", "NOT", "TO"}


def print_module(module: ast.Module) -> str:
    """The whole module as canonical text, with its comments where they were written.

    Examples
    --------
    >>> from query_lang.parser import parse
    >>> print(print_module(parse(
    ...     "# probing\\nrule r from txn by card pattern a b  # two steps\\n  within 10m\\n"
    ... )), end="")
    # probing
    rule r
      from txn
      by card
      pattern a b  # two steps
      within 10m
    """
    count = len(module.declarations)
    placed: dict[int, list[ast.Comment]] = {}
    for c in module.comments:
        placed.setdefault(c.declaration if 0 <= c.declaration < count else count, []).append(c)
    blocks = [
        _with_comments(_lines(decl, {c.clause for c in placed.get(k, ())}), placed.get(k, []))
        for k, decl in enumerate(module.declarations)
    ]
    if count in placed:
        blocks.append("\n".join(_own_lines(placed[count], "", blank_after_last=False)))
    return "\n\n".join(blocks) + "\n"


def print_declaration(decl: ast.Declaration) -> str:
    return "\n".join(text for _, _, text in _lines(decl, set()))


# A printed line: (clause, item, text), named as in :class:`query_lang.ast.Comment`.
_Line = tuple[str, int, str]


def _lines(decl: ast.Declaration, keep: set[str]) -> list[_Line]:
    """The printed lines of ``decl``; a clause that holds its default value is left out unless
    it is in ``keep`` (a comment goes with it)."""
    if isinstance(decl, ast.StreamDecl):
        return _stream(decl)
    if isinstance(decl, ast.RuleDecl):
        return _rule(decl, keep)
    if isinstance(decl, ast.QueryDecl):
        return _query(decl, keep)
    if isinstance(decl, ast.MetricDecl):
        return _metric(decl, keep)
    return [("", 0, _one_line(decl))]


def _with_comments(lines: list[_Line], comments: list[ast.Comment]) -> str:
    """The printed lines of a declaration with its comments: each before or at the end of its
    line, those of the first line before the declaration, those of ``end`` after it."""
    known = {(clause, item) for clause, item, _ in lines}
    at: dict[tuple[str, int], list[ast.Comment]] = {}
    for c in comments:
        place = (c.clause, c.item)
        if place not in known and c.clause != ast.AFTER_DECLARATION:
            place = ("", 0)  # its line is gone (a tree built or changed by hand): lead with it
            c = dataclasses.replace(c, trailing=False)
        at.setdefault(place, []).append(c)
    out: list[str] = []
    for clause, item, text in lines:
        here = at.get((clause, item), [])
        trailing = here.pop() if here and here[-1].trailing and text else None
        if clause == "":
            out.extend(_own_lines(here, ""))
        else:
            out.extend(_own_lines(here, text[: len(text) - len(text.lstrip())] or "  "))
        out.append(f"{text}  {trailing.text}" if trailing is not None else text)
    out.extend(_own_lines(at.get((ast.AFTER_DECLARATION, 0), []), "  ", blank_after_last=False))
    return "\n".join(out)


def _own_lines(
    comments: list[ast.Comment], indent: str, blank_after_last: bool = True
) -> list[str]:
    """Comments on lines of their own; a blank line after those that had one in the source
    (only at the top level: inside a declaration ``indent`` is not empty)."""
    out = []
    for i, c in enumerate(comments):
        out.append(indent + c.text)
        last = i == len(comments) - 1
        if not indent and c.blank_after and (blank_after_last or not last):
            out.append("")
    return out


def _one_line(decl: ast.Declaration) -> str:
    if isinstance(decl, ast.Include):
        return f"include {quote(decl.path)}"
    if isinstance(decl, ast.ListDecl):
        if decl.path is not None:
            return f"list {decl.name} from {quote(decl.path)}"
        return f"list {decl.name} ({', '.join(quote(v) for v in decl.values)})"
    if isinstance(decl, ast.TableDecl):
        return _table(decl)
    if isinstance(decl, ast.WebhookDecl):
        secrets = "".join(
            f" secret env {s.env}" if s.env else f" secret {quote(s.value or '')}"
            for s in decl.secrets
        )
        return f"webhook {decl.name} url {quote(decl.url)}{secrets}"
    raise TypeError(f"not a declaration: {decl!r}")


def _table(t: ast.TableDecl) -> str:
    text = f"table {t.name} from {t.stream} key {', '.join(t.key)}"
    if t.op_field is not None:
        text += f" op {t.op_field}"
        for kind, values in (("upsert", t.upsert), ("delete", t.delete)):
            if values:
                text += f" {kind} {', '.join(quote(v) for v in values)}"
    if t.retain is not None:
        text += f" retain {print_duration(t.retain)}"
    return text


def _stream(s: ast.StreamDecl) -> list[_Line]:
    lines: list[_Line] = [("", 0, f"stream {s.name} (")]
    last = len(s.fields) - 1
    lines.extend(
        ("field", i, f"  {f.name} {f.type}{',' if i < last else ''}")
        for i, f in enumerate(s.fields)
    )
    if not s.fields:
        lines.append(("field", 0, ""))
    tail = ")"
    if s.time_field:
        tail += f" time {s.time_field}"
        if s.time_unit:
            tail += f" unit {s.time_unit}"
        kinds = ast.TIME_SOURCE_KINDS
        ordered = sorted(
            s.time_sources, key=lambda t: kinds.index(t.kind) if t.kind in kinds else len(kinds)
        )
        tail += "".join(f" {t.kind} {t.field}" for t in ordered)
    if s.lateness is not None:
        tail += f" lateness {print_duration(s.lateness)}"
    if s.ahead is not None:
        tail += f" ahead {print_duration(s.ahead)}"
    if s.id_field:
        tail += f" id {s.id_field}"
    lines.append(("options", 0, tail))
    return lines


def _head(kind: str, name: str, description: str | None) -> _Line:
    return ("", 0, f"{kind} {name}" + (f" {quote(description)}" if description is not None else ""))


def _clause(clause: str, text: str) -> _Line:
    return (clause, 0, "  " + text)


def _alerting(decl, keep: set[str]) -> list[_Line]:
    lines = []
    if decl.severity != "medium" or "severity" in keep:
        lines.append(_clause("severity", f"severity {decl.severity}"))
    if decl.notify:
        lines.append(_clause("notify", f"notify {', '.join(decl.notify)}"))
    if decl.tags:
        lines.append(_clause("tags", f"tags {', '.join(quote(t) for t in decl.tags)}"))
    if decl.throttle is not None:
        lines.append(_clause("throttle", f"throttle {print_duration(decl.throttle)}"))
    return lines


def _items(items: tuple[ast.EmitItem, ...]) -> str:
    return ", ".join(
        print_expr(i.expr) + (f" as {i.alias}" if i.alias else "") for i in items
    )


def _rule(r: ast.RuleDecl, keep: set[str]) -> list[_Line]:
    lines = [_head("rule", r.name, r.description), _clause("from", f"from {', '.join(r.streams)}")]
    if r.by:
        lines.append(_clause("by", "by " + ", ".join(_key_part(k) for k in r.by)))
    lines.append(_clause("pattern", f"pattern {print_pattern(r.pattern)}"))
    if r.any_for:
        lines.append(_clause("contiguity", f"contiguity any for {', '.join(r.any_for)}"))
    elif r.contiguity != "relaxed" or "contiguity" in keep:
        lines.append(_clause("contiguity", f"contiguity {r.contiguity}"))
    if r.partials != "all" or "partials" in keep:
        lines.append(_clause("partials", f"partials {r.partials}"))
    last = len(r.defines) - 1
    lines.extend(
        (
            "define",
            i,
            ("  define " if i == 0 else "         ") + _define(d) + ("," if i < last else ""),
        )
        for i, d in enumerate(r.defines)
    )
    if r.within is not None:
        lines.append(_clause("within", f"within {print_duration(r.within)}"))
    if r.skip.kind != "past_last" or "after match" in keep:
        lines.append(_clause("after match", f"after match {_skip(r.skip)}"))
    if r.emit is not None:
        lines.append(_clause("emit", f"emit {_items(r.emit)}"))
    if r.unique is not None:
        within = "" if r.unique.within is None else f" for {print_duration(r.unique.within)}"
        exprs = ", ".join(print_expr(e) for e in r.unique.exprs)
        lines.append(_clause("unique", f"unique {exprs}{within}"))
    if r.having is not None:
        lines.append(_clause("having", f"having {print_expr(r.having)}"))
    lines.extend(_alerting(r, keep))
    return lines


def _key_part(k: ast.KeyPart) -> str:
    return " = ".join(f"{s}.{f}" if s else f for s, f in k.refs)


def _define(d: ast.Define) -> str:
    if d.stream is not None and d.condition is None:
        body = d.stream
    elif d.stream is not None:
        body = f"{d.stream} where {print_expr(d.condition)}"
    else:
        body = print_expr(d.condition) if d.condition is not None else "true"
    keys = ""
    if len(d.keys) == 1:
        keys = f" by {print_expr(d.keys[0])}"
    elif d.keys:
        keys = f" by ({', '.join(print_expr(k) for k in d.keys)})"
    return f"{d.var} as {body}{keys}"


def _skip(s: ast.SkipStrategy) -> str:
    return {
        "past_last": "skip past last",
        "to_next": "skip to next",
        "to_first": f"skip to first {s.var}",
        "to_last": f"skip to last {s.var}",
        "no_skip": "no skip",
    }[s.kind]


def _query(q: ast.QueryDecl, keep: set[str]) -> list[_Line]:
    lines = [
        _head("query", q.name, q.description),
        _clause("from", f"from {', '.join(q.streams)}"),
        _clause("match", f"match {print_search(q.match)}"),
    ]
    lines.extend(_alerting(q, keep))
    return lines


def _metric(m: ast.MetricDecl, keep: set[str]) -> list[_Line]:
    lines = [
        _head("metric", m.name, m.description),
        _clause("from", f"from {', '.join(m.streams)}"),
    ]
    if m.where is not None:
        lines.append(_clause("where", f"where {print_expr(m.where)}"))
    if m.by:
        lines.append(_clause("by", f"by {', '.join(m.by)}"))
    w = m.window
    if w.kind == "tumbling":
        window = f"window tumbling {print_duration(w.size)}"
    elif w.kind == "hopping":
        window = f"window hopping {print_duration(w.size)} every {print_duration(w.every)}"
    elif w.kind == "sliding":
        every = f" every {print_duration(w.every)}" if w.every is not None else ""
        window = f"window sliding {print_duration(w.size)}{every}"
    else:
        window = f"window session gap {print_duration(w.size)}"
    lines.append(_clause("window", window))
    lines.append(_clause("select", f"select {_items(m.select)}"))
    if m.having is not None:
        lines.append(_clause("having", f"having {print_expr(m.having)}"))
    lines.extend(_alerting(m, keep))
    return lines


# --------------------------------------------------------------------------- patterns


def print_pattern(p: ast.Pattern) -> str:
    return _pattern(p, 1)


def _pattern(p: ast.Pattern, context: int) -> str:
    if isinstance(p, ast.PatVar):
        return p.name
    if isinstance(p, ast.PatAbsent):
        # `(!x)+` parses (the checks reject it, with a location) and must print back so
        return f"(!{p.name})" if context > 3 else f"!{p.name}"
    if isinstance(p, ast.PatAlt):
        text = " | ".join(_pattern(o, 2) for o in p.options)
        return f"({text})" if context > 1 else text
    if isinstance(p, ast.PatSeq):
        text = " ".join(_pattern(i, 3) for i in p.items)
        return f"({text})" if context > 2 else text
    if isinstance(p, ast.PatQuant):
        inner = _pattern(p.inner, 4)
        return inner + _quantifier(p)
    raise TypeError(f"not a pattern: {p!r}")


def _quantifier(q: ast.PatQuant) -> str:
    low, high = q.min, q.max
    if (low, high) == (0, 1):
        text = "?"
    elif (low, high) == (0, None):
        text = "*"
    elif (low, high) == (1, None):
        text = "+"
    elif low == high:
        text = f"{{{low}}}"
    elif high is None:
        text = f"{{{low},}}"
    elif low == 0:
        text = f"{{,{high}}}"
    else:
        text = f"{{{low},{high}}}"
    return text + ("" if q.greedy else "?")


# --------------------------------------------------------------------------- search

_S_OR_LEVEL, _S_AND_LEVEL, _S_NOT_LEVEL, _S_ATOM = 1, 2, 3, 4


def print_search(node: ast.SearchNode) -> str:
    return _search(node, _S_OR_LEVEL)


def _search(node: ast.SearchNode, context: int) -> str:
    if isinstance(node, ast.SearchOr):
        text = " OR ".join(_search(c, _S_AND_LEVEL) for c in node.clauses)
        return f"({text})" if context > _S_OR_LEVEL else text
    if isinstance(node, ast.SearchAnd):
        text = " AND ".join(_search(c, _S_NOT_LEVEL) for c in node.clauses)
        return f"({text})" if context > _S_AND_LEVEL else text
    if isinstance(node, ast.SearchNot):
        return f"NOT {_search(node.clause, _S_NOT_LEVEL)}"
    prefix = f"{node.field}:" if getattr(node, "field", None) else ""
    if isinstance(node, ast.SearchTerm):
        return prefix + _search_word(node.text)
    if isinstance(node, ast.SearchPhrase):
        return prefix + quote(node.text)
    if isinstance(node, ast.SearchPrefix):
        return prefix + _escape_word(node.prefix) + "*"
    if isinstance(node, ast.SearchWildcard):
        return prefix + node.pattern
    if isinstance(node, ast.SearchRegex):
        return prefix + "/" + node.pattern.replace("/", "\\/") + "/"
    if isinstance(node, ast.SearchRange):
        low = "*" if node.low is None else _search_value(node.low)
        high = "*" if node.high is None else _search_value(node.high)
        return (
            f"{node.field}:{'[' if node.include_low else '{'}{low} TO {high}"
            f"{']' if node.include_high else '}'}"
        )
    if isinstance(node, ast.SearchCompare):
        return f"{node.field} {node.op} {_search_value(node.value)}"
    if isinstance(node, ast.SearchExists):
        return f"_exists_:{node.field}"
    raise TypeError(f"not a search node: {node!r}")


def _escape_word(text: str) -> str:
    """Backslash the characters that would make a search word a wildcard."""
    return text.replace("\\", "\\\\").replace("*", "\\*").replace("?", "\\?")


def _search_word(text: str) -> str:
    escaped = _escape_word(text)
    if _SWORD.fullmatch(escaped) and text not in _SEARCH_KEYWORDS:
        return escaped
    return quote(text)


def _search_value(value) -> str:
    if isinstance(value, bool):
        return quote(str(value).lower())
    if isinstance(value, int | float):
        return repr(value) if isinstance(value, float) else str(value)
    if _SWORD.fullmatch(value) and search_number(value) == value and value != "*" and (
        value not in _SEARCH_KEYWORDS
    ):
        return value
    return quote(value)


__all__ = [
    "print_module",
    "print_declaration",
    "print_expr",
    "print_pattern",
    "print_search",
    "print_duration",
    "quote",
]
