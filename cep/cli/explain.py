"""``vigil explain``: a rule's compiled automaton (text or Graphviz DOT), or why a query matches
one document or not."""

from __future__ import annotations

import argparse
import json
import sys

from cep.cli.arguments import EXIT_ERRORS, EXIT_OK, UsageError, expand_rule_paths
from cep.engine.program import compile_program_rule, empty_tables, load_list
from cep.engine.queries import query_schema
from cep.events.event import BadEventError, StreamSchema, parse_json_line
from cep.nfa.explain import describe, to_dot
from percolator import AnalyzedDocument, compile_query
from query_lang import IncludeError, VigilError, ast, check_program
from query_lang.includes import read_named_file


def configure_parser(sub) -> None:
    explain = sub.add_parser(
        "explain",
        help="print a rule's compiled automaton, or why a query matches a document or not",
    )
    explain.add_argument("file", help="the rule file")
    which = explain.add_mutually_exclusive_group(required=True)
    which.add_argument("--rule", help="the rule's name")
    which.add_argument("--query", help="the query's name (with --document)")
    explain.add_argument("--document", metavar="JSON",
                         help="with --query: the event, as a JSON object or @FILE")
    explain.add_argument("--stream", help="with --query: the event's stream, when the query "
                         "reads several")
    explain.add_argument("--format", choices=("text", "dot"), default="text",
                         help="for a rule: text (default) or Graphviz DOT")
    explain.set_defaults(handler=_cmd_explain)


def _cmd_explain(args: argparse.Namespace) -> int:
    program, errors = check_program(expand_rule_paths([args.file]))
    for err in errors:
        print(err.render(), file=sys.stderr)
    if errors:
        return EXIT_ERRORS
    if args.query is not None:
        return _explain_query(program, args)
    if args.document is not None or args.stream is not None:
        raise UsageError("--document and --stream go with --query")
    rule = program.rules.get(args.rule)
    if rule is None:
        known = ", ".join(sorted(program.rules)) or "none"
        raise UsageError(f"no rule named '{args.rule}' in {args.file} (rules: {known})")
    try:
        lists = {name: load_list(decl) for name, decl in program.lists.items()}
        tables = empty_tables(program.tables, program.streams)
        compiled = compile_program_rule(rule, program.streams, lists, tables=tables)
    except VigilError as err:
        # Every compile error `vigil check` cannot see (check reports the limits it can).
        _report(err, program)
        return EXIT_ERRORS
    print(to_dot(compiled) if args.format == "dot" else describe(compiled))
    return EXIT_OK


def _report(err: VigilError, program) -> None:
    for each in getattr(err, "errors", None) or [err]:
        if each.source is None and each.span is not None:
            each.source = program.sources.get(each.span.file)
        print(each.render(), file=sys.stderr)


def _explain_query(program, args: argparse.Namespace) -> int:
    """Why the query matches the document or not, clause by clause, as the engine decides it:
    the document is first validated and normalised as an event of the query's stream."""
    decl = program.queries.get(args.query)
    if decl is None:
        known = ", ".join(sorted(program.queries)) or "none"
        raise UsageError(f"no query named '{args.query}' in {args.file} (queries: {known})")
    if args.format != "text":
        raise UsageError("--format dot is for rules; a query is explained as text")
    if args.document is None:
        raise UsageError("--query needs --document (a JSON object, or @FILE)")
    stream = args.stream
    if stream is None:
        if len(decl.streams) > 1:
            raise UsageError(f"query '{decl.name}' reads {', '.join(decl.streams)}: "
                             "name the document's with --stream")
        stream = decl.streams[0]
    elif stream not in decl.streams:
        raise UsageError(f"query '{decl.name}' does not read stream '{stream}' "
                         f"(it reads {', '.join(decl.streams)})")
    text = args.document
    if text.startswith("@"):
        try:
            # Read as a rule file is: at most its size cap, UTF-8 (never /dev/zero forever).
            text = read_named_file(text[1:], ast.Span(text[1:]))
        except IncludeError as err:
            raise UsageError(f"cannot read the document: {err.message}") from None
    try:
        # Read as both engines read an event line: its limits, numbers, encoding.
        raw = parse_json_line(text.strip())
    except BadEventError as err:
        print(f"vigil: the document is not a usable event: {err}", file=sys.stderr)
        return EXIT_ERRORS
    decl_stream = program.streams[stream]
    try:
        event = StreamSchema.from_decl(decl_stream).normalise(raw, seq=0, position=0)
    except BadEventError as err:
        print(f"vigil: the document is not a valid '{stream}' event: {err}", file=sys.stderr)
        return EXIT_ERRORS
    schema = query_schema(decl_stream)
    try:
        compiled = compile_query(decl.match, schema)
    except VigilError as err:
        _report(err, program)
        return EXIT_ERRORS
    doc = AnalyzedDocument(event.fields, schema)
    print(compiled.explain(doc))
    if compiled.matches(doc):
        highlights = compiled.highlights(doc)
        print("highlights: " + json.dumps(highlights, separators=(",", ":"), ensure_ascii=False))
    return EXIT_OK
