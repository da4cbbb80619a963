"""``vigil check`` and ``vigil format``: rule files checked with every error located, and printed
in canonical form (with their comments)."""

from __future__ import annotations

import argparse
import sys

from cep.cli.arguments import EXIT_ERRORS, EXIT_OK, expand_rule_paths
from cep.engine.queries import query_warnings
from cep.engine.validation import compile_errors
from query_lang import VigilError, ast, check_program, parse, print_module
from query_lang.checks import stream_warnings
from query_lang.includes import read_named_file


def configure_parser(sub) -> None:
    check = sub.add_parser("check", help="parse and check rule files; report every error")
    check.add_argument("files", nargs="+", help="rule files, directories or glob patterns")
    check.add_argument("-q", "--quiet", action="store_true", help="print nothing when clean")
    check.set_defaults(handler=_cmd_check)

    fmt = sub.add_parser(
        "format", help="print rule files in canonical form, their comments where they were"
    )
    fmt.add_argument("files", nargs="+")
    fmt.set_defaults(handler=_cmd_format)


def _cmd_check(args: argparse.Namespace) -> int:
    paths = expand_rule_paths(args.files)
    program, errors = check_program(paths)
    if not errors:
        errors = compile_errors(program)
    for err in errors:
        print(err.render(), file=sys.stderr)
    if errors:
        files = len({e.file for e in errors})
        print(f"{len(errors)} error(s) in {files} file(s)", file=sys.stderr)
        return EXIT_ERRORS

    # Warnings are printed, never fatal: the check still passes (exit 0).
    warnings = [*stream_warnings(program.streams.values(), program.sources),
                *query_warnings(program)]
    for warning in warnings:
        print(warning.render(), file=sys.stderr)
    counts = (
        f"{len(program.rules)} rule(s), {len(program.queries)} query(ies), "
        f"{len(program.metrics)} metric(s), {len(program.streams)} stream(s)"
        + (f", {len(program.tables)} table(s)" if program.tables else "")
    )
    if not args.quiet:
        print(f"ok: {len(program.modules)} file(s), {counts}")
    return EXIT_OK


def _cmd_format(args: argparse.Namespace) -> int:
    status = EXIT_OK
    for path in expand_rule_paths(args.files):
        try:
            # Read as `check` reads a file it is given: size cap, UTF-8, errors located.
            module = parse(read_named_file(path, ast.Span(path)), path)
        except VigilError as err:
            print(err.render(), file=sys.stderr)
            status = EXIT_ERRORS
            continue
        sys.stdout.write(print_module(module))
    return status
