"""The ``vigil`` command line: check, explain and run rule files.

Exit codes follow compilers: 0 clean, 1 errors in the input, 2 a usage problem.
"""

from __future__ import annotations

import argparse
import glob
import os
import sys
from collections.abc import Sequence

EXIT_OK, EXIT_ERRORS, EXIT_USAGE = 0, 1, 2


class UsageError(Exception):
    """The command line itself is wrong (missing file, bad option)."""


def expand_rule_paths(patterns: Sequence[str]) -> list[str]:
    """Files named on the command line: files as given, directories searched for ``*.vigil``,
    and glob patterns (``examples/**/*.vigil``) expanded even when the shell did not."""
    paths: list[str] = []
    for pattern in patterns:
        if os.path.isdir(pattern):
            found = sorted(glob.glob(os.path.join(pattern, "**", "*.vigil"), recursive=True))
        elif os.path.exists(pattern):
            found = [pattern]
        elif any(c in pattern for c in "*?["):
            found = sorted(glob.glob(pattern, recursive=True))
            if not found and "**/" in pattern:
                found = sorted(glob.glob(pattern.replace("**/", ""), recursive=True))
        else:
            raise UsageError(f"no such file or directory: {pattern}")
        if not found:
            raise UsageError(f"no rule files match {pattern}")
        for path in found:
            if path not in paths:
                paths.append(path)
    return paths


def _cmd_check(args: argparse.Namespace) -> int:
    from query_lang import check_program

    paths = expand_rule_paths(args.files)
    program, errors = check_program(paths)
    for err in errors:
        print(err.render(), file=sys.stderr)
    if errors:
        files = len({e.file for e in errors})
        print(f"{len(errors)} error(s) in {files} file(s)", file=sys.stderr)
        return EXIT_ERRORS
    from cep.standing import query_warnings

    for warning in query_warnings(program):
        print(warning.render(), file=sys.stderr)
    counts = (
        f"{len(program.rules)} rule(s), {len(program.queries)} query(ies), "
        f"{len(program.metrics)} metric(s), {len(program.streams)} stream(s)"
    )
    if not args.quiet:
        print(f"ok: {len(program.modules)} file(s), {counts}")
    return EXIT_OK


def _cmd_format(args: argparse.Namespace) -> int:
    from query_lang import ErrorList, parse, print_module

    status = EXIT_OK
    for path in expand_rule_paths(args.files):
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        try:
            module = parse(text, path)
        except ErrorList as err:
            print(err.render(), file=sys.stderr)
            status = EXIT_ERRORS
            continue
        sys.stdout.write(print_module(module))
    return status


def _cmd_explain(args: argparse.Namespace) -> int:
    from cep.engine import load_list
    from cep.explain import describe, to_dot
    from cep.nfa import compile_rule
    from query_lang import check_program

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
    lists = {name: load_list(decl) for name, decl in program.lists.items()}
    compiled = compile_rule(rule, lists=lists, streams=program.streams)
    print(to_dot(compiled) if args.format == "dot" else describe(compiled))
    return EXIT_OK


def _explain_query(program, args: argparse.Namespace) -> int:
    """Why the query matches the document or not, clause by clause, as the engine decides it:
    the document is first validated and normalised as an event of the query's stream."""
    import json

    from cep.events import BadEventError, StreamSchema
    from cep.standing import query_schema
    from percolator import AnalyzedDocument, compile_query

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
            with open(text[1:], encoding="utf-8") as fh:
                text = fh.read()
        except OSError as err:
            raise UsageError(f"cannot read the document: {err}") from err
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        print(f"vigil: the document is not JSON: {err}", file=sys.stderr)
        return EXIT_ERRORS
    if not isinstance(raw, dict):
        print("vigil: the document must be a JSON object", file=sys.stderr)
        return EXIT_ERRORS
    decl_stream = program.streams[stream]
    try:
        event = StreamSchema.from_decl(decl_stream).normalise(raw, seq=0, position=0)
    except BadEventError as err:
        print(f"vigil: the document is not a valid '{stream}' event: {err}", file=sys.stderr)
        return EXIT_ERRORS
    schema = query_schema(decl_stream)
    compiled = compile_query(decl.match, schema)
    doc = AnalyzedDocument(event.fields, schema)
    print(compiled.explain(doc))
    if compiled.matches(doc):
        highlights = compiled.highlights(doc)
        print("highlights: " + json.dumps(highlights, separators=(",", ":"), ensure_ascii=False))
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vigil",
        description="Standing rules, queries and metrics over event streams.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    check = sub.add_parser("check", help="parse and check rule files; report every error")
    check.add_argument("files", nargs="+", help="rule files, directories or glob patterns")
    check.add_argument("-q", "--quiet", action="store_true", help="print nothing when clean")
    check.set_defaults(handler=_cmd_check)

    fmt = sub.add_parser("format", help="print rule files in canonical form")
    fmt.add_argument("files", nargs="+")
    fmt.set_defaults(handler=_cmd_format)

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

    for module_name in ("cep.run", "cep.alerting", "cep.sample", "cep.demo"):
        _add_optional_commands(sub, module_name)
    return parser


def _add_optional_commands(sub, module_name: str) -> None:
    """Sub-commands that live next to the code they drive register themselves here."""
    import importlib

    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        if err.name and module_name.startswith(err.name):
            return
        raise
    configure = getattr(module, "configure_parser", None)
    if configure is not None:
        configure(sub)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return EXIT_USAGE if exit_.code not in (0, None) else EXIT_OK
    try:
        return int(args.handler(args))
    except UsageError as err:
        print(f"vigil: {err}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("vigil: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
