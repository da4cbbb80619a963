"""Loading a program: DSL text, a rule file (with its includes) or parsed modules checked into
declarations against what is registered, and the containers of its ``list`` declarations."""

from __future__ import annotations

import os
from collections.abc import Callable, Container, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cep.metrics import CompiledMetric, compile_metric
from cep.nfa import CompiledRule, compile_rule
from cep.tables import TableFeed
from percolator.evaluate import field_predicate
from query_lang import ast
from query_lang.checks import check_declarations, event_time_field
from query_lang.errors import ErrorList, IncludeError, VigilError, VigilNameError
from query_lang.includes import read_list_file
from query_lang.loader import check_program
from sketches.bloom import BloomFilter

__all__ = [
    "BLOOM_FALSE_POSITIVE_RATE",
    "BLOOM_THRESHOLD",
    "add_declarations",
    "empty_tables",
    "lookup_horizons",
    "load_declarations",
    "load_list",
]

BLOOM_THRESHOLD = 100_000
"""Lists with more values than this are held in a Bloom filter instead of a set."""

BLOOM_FALSE_POSITIVE_RATE = 1e-6


def load_list(decl: ast.ListDecl) -> Any:
    """The membership container of a ``list`` declaration.

    Values come inline or from a file (one value a line, blank lines ignored, path relative
    to the declaring file). Lists larger than :data:`BLOOM_THRESHOLD` are held in a Bloom
    filter (``sketches.BloomFilter``) to bound memory; smaller ones in a ``frozenset``.

    Raises
    ------
    query_lang.errors.IncludeError
        When the file cannot be read.
    """
    if decl.path is None:
        return frozenset(decl.values)
    # A list file is read as an included rule file is: below the declaring file's directory
    # or an include root, a regular file, read no further than its cap.
    text = read_list_file(decl)
    values = [v for v in (line.strip() for line in text.split("\n")) if v]
    if len(values) <= BLOOM_THRESHOLD:
        return frozenset(values)
    return _bloom(values)


def _bloom(values: list[str]) -> Any:
    bloom = BloomFilter(capacity=len(values), error_rate=BLOOM_FALSE_POSITIVE_RATE)
    bloom.update(np.asarray(values, dtype=object))
    return bloom


def load_declarations(
    source: Any, known: Sequence[ast.Declaration] = ()
) -> list[ast.Declaration]:
    """Parse and check what :meth:`Engine.register` was given, against what is registered
    (``known``), compiling nothing: for callers that need a program's declarations only.

    Files are loaded with their includes. The new declarations are checked with the earlier
    registrations' names in scope, so a rule file may use streams registered before it; the
    earlier ones passed these checks and are not checked again (one declaration added to
    thousands costs the one).
    """
    if isinstance(source, ast.Module):
        source = [source]
    if isinstance(source, list | tuple) and all(isinstance(m, ast.Module) for m in source):
        new = [d for m in source for d in m.declarations if not isinstance(d, ast.Include)]
        new = _without_repeats(new, known)
        errors = check_declarations(new, known=known)
    else:
        if isinstance(source, os.PathLike) or (
            isinstance(source, str) and "\n" not in source and _looks_like_path(source)
        ):
            if not Path(source).is_file():
                raise IncludeError(f"file not found: {source}", ast.Span(str(source)))
            program, errors = check_program([str(source)])
        elif isinstance(source, str):
            program, errors = check_program(text=source)
        else:
            raise TypeError(
                f"register() takes DSL text, a path or parsed Modules, not {type(source).__name__}"
            )
        new = _without_repeats(program.declarations, known)
        if known and errors:
            # Errors about names the earlier registrations declare are not errors here.
            alone = {_error_key(e) for e in check_declarations(new, program.sources)}
            loading = [e for e in errors if _error_key(e) not in alone]
            errors = loading + check_declarations(new, program.sources, known=known)
        for err in errors:
            if err.source is None and err.span is not None:
                err.source = program.sources.get(err.span.file)
    if errors:
        raise errors[0] if len(errors) == 1 else ErrorList(errors)
    return new


def _without_repeats(
    new: Sequence[ast.Declaration], known: Sequence[ast.Declaration]
) -> list[ast.Declaration]:
    """Drop streams, lists and webhooks identical to registered ones (two rule files that
    include the same ``common.vigil``); a different redefinition stays and is reported."""
    shared = (ast.StreamDecl, ast.ListDecl, ast.TableDecl, ast.WebhookDecl)
    registered = {(type(d), d.name): d for d in known if isinstance(d, shared)}
    return [
        d for d in new if not (isinstance(d, shared) and registered.get((type(d), d.name)) == d)
    ]


def _error_key(error: VigilError) -> tuple:
    return (type(error).__name__, error.message, error.span)


def _looks_like_path(text: str) -> bool:
    stripped = text.strip()
    return bool(stripped) and (stripped.endswith(".vigil") or Path(stripped).is_file())


def add_declarations(
    new_decls: Sequence[ast.Declaration],
    streams: Mapping[str, ast.StreamDecl],
    lists: Mapping[str, Any],
    registered: Container[str],
) -> tuple[dict[str, ast.StreamDecl], dict[str, Any]]:
    """The streams and lists once ``new_decls`` join the registered ones, checked against them.

    ``registered`` holds the names of the rules, queries and metrics already registered. Lists
    are loaded (:func:`load_list`). (A table redefined differently is a duplicate name for the
    checks of :func:`load_declarations`: the rules reading it are compiled against it.)

    Raises
    ------
    query_lang.errors.VigilError
        When a stream is redefined differently, a list cannot be read, a name is
        taken, or a rule reads a stream that is undeclared or has no event time.
    """
    streams = dict(streams)
    lists = dict(lists)
    errors: list[VigilError] = []
    for decl in new_decls:
        if isinstance(decl, ast.StreamDecl):
            old = streams.get(decl.name)
            if old is not None and old != decl:
                errors.append(
                    VigilNameError(
                        f"stream '{decl.name}' is already registered with another definition",
                        decl.span,
                    )
                )
            streams[decl.name] = decl
        elif isinstance(decl, ast.ListDecl):
            try:
                lists[decl.name] = load_list(decl)
            except VigilError as exc:
                errors.append(exc)
    rules = [d for d in new_decls if isinstance(d, ast.RuleDecl)]
    standing = [d for d in new_decls if isinstance(d, ast.QueryDecl | ast.MetricDecl)]
    seen: set[str] = set()
    for decl in [*rules, *standing]:
        if decl.name in registered or decl.name in seen:
            errors.append(
                VigilNameError(
                    f"'{decl.name}' is already registered; unregister it first",
                    decl.span,
                )
            )
        seen.add(decl.name)
        for stream in decl.streams:
            if stream not in streams:
                errors.append(
                    VigilNameError(
                        f"rule '{decl.name}' reads undeclared stream '{stream}'", decl.span
                    )
                )
            elif event_time_field(streams[stream]) is None:
                # Checked with the program too; here for streams registered before it.
                kind = type(decl).__name__.removesuffix("Decl").lower()
                errors.append(
                    VigilNameError(
                        f"{kind} '{decl.name}' reads stream '{stream}', which has no event "
                        "time: declare `time FIELD`",
                        streams[stream].span,
                    )
                )
    if errors:
        raise errors[0] if len(errors) == 1 else ErrorList(errors)
    return streams, lists


def empty_tables(
    tables: Mapping[str, ast.TableDecl], streams: Mapping[str, ast.StreamDecl]
) -> dict[str, Any]:
    """Empty tables of a program's ``table`` declarations: what a rule that looks them up is
    compiled against where no event flows (``vigil explain``, the console's automaton)."""
    return {name: TableFeed(decl, streams[decl.stream]).table
            for name, decl in tables.items() if decl.stream in streams}


def lookup_horizons(
    rules: Sequence[ast.RuleDecl], metrics: Sequence[CompiledMetric] = ()
) -> dict[str, int]:
    """Per table, how far behind the watermark something may read it: the longest ``within``
    of the rules that look it up (0 without one; a match an absence fires reads it in its
    ``emit``) and the lateness of the metrics that do (a late event correcting a window)."""
    horizons: dict[str, int] = {}
    reads = [(rule, rule.within.ms if rule.within is not None else 0) for rule in rules]
    reads += [(metric.decl, metric.lateness_ms) for metric in metrics if metric.reads_tables]
    for decl, behind in reads:
        for node in ast.walk(decl):
            if isinstance(node, ast.Lookup):
                horizons[node.table] = max(horizons.get(node.table, 0), behind)
    return horizons


def compile_program_rule(
    decl: ast.RuleDecl,
    streams: Mapping[str, ast.StreamDecl],
    lists: Mapping[str, Any],
    *,
    max_partials: int | None = None,
    compiler: Callable[..., CompiledRule] = compile_rule,
    version: int = 1,
    tables: Mapping[str, Any] | None = None,
) -> CompiledRule:
    """A rule of a program compiled as every engine runs it: with the program's streams,
    lists and tables (``lookup``), and ``search(...)`` conditions answered by the percolator.
    ``version`` (part of every match and its id) is 1 unless a restart found the rule changed
    (:mod:`cep.engine.checkpoint`)."""
    options: dict[str, Any] = {
        "lists": dict(lists),
        "search": field_predicate,
        "version": version,
        "streams": streams,
    }
    if tables:
        options["tables"] = dict(tables)
    if max_partials is not None:
        options["max_partials"] = max_partials
    return compiler(decl, **options)


def compile_program_metric(
    decl: ast.MetricDecl,
    streams: Mapping[str, ast.StreamDecl],
    lists: Mapping[str, Any],
    *,
    lateness_ms: int | None = None,
    version: int = 1,
    tables: Mapping[str, Any] | None = None,
) -> CompiledMetric:
    """A metric of a program compiled as every engine runs it (see
    :func:`compile_program_rule`)."""
    return compile_metric(
        decl, streams=streams, lists=lists, search=field_predicate, lateness_ms=lateness_ms,
        version=version, tables=tables,
    )
