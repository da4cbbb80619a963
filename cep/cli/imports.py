"""``vigil import FORMAT FILES``: rules written for other tools, printed as one Vigil file.

One sub-command per format (``vigil import eql`` ...); each prints the Vigil text on stdout
and every refusal, located in its source file, on stderr (exit 1 if any).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from cep.cli import sigma_import
from cep.cli.arguments import EXIT_ERRORS, EXIT_OK, UsageError
from query_lang.imports.eql import DIALECTS, EqlOptions, import_eql, read_sources


def configure_parser(sub) -> None:
    parser = sub.add_parser("import", help="translate rules of other tools (EQL, Sigma) to Vigil")
    formats = parser.add_subparsers(dest="import_format", metavar="FORMAT")
    formats.required = True
    _configure_eql(formats)
    sigma_import.configure_import(formats)


def _configure_eql(formats) -> None:
    eql = formats.add_parser(
        "eql", help="EQL queries or Elastic detection rules (TOML) to a Vigil file",
        description="Translate EQL queries (a bare query per file, or Elastic detection-rule "
        "TOML files) into one Vigil file on stdout. A construct without an exact Vigil "
        "equivalent is an error naming it and its place (exit 1); the other queries are "
        "still printed. See docs/import.md.",
    )
    eql.add_argument("files", nargs="+", help="EQL files (.toml: a detection rule)")
    eql.add_argument("--dialect", choices=DIALECTS, default="elasticsearch",
                     help="elasticsearch (default: `==` exact, `:` and `~` ignore case) or "
                     "classic (the eql package's language: `==` ignores case, takes *)")
    eql.add_argument("--case-sensitive", action="store_true",
                     help="classic dialect: compare strings exactly")
    eql.add_argument("--stream", action="append", default=[], metavar="CATEGORY=NAME",
                     help="read the events of an event category from stream NAME (repeatable)")
    eql.add_argument("--any-streams", default="", metavar="S1,S2",
                     help="the streams `any where` reads (default: every stream of the output)")
    eql.add_argument("--schema", metavar="FILE",
                     help='JSON: {"STREAM or *": {"FIELD": "string|int|float|bool"}}; fields '
                     "not in it are typed by their use, else string")
    eql.add_argument("--time-field", default="timestamp", metavar="NAME",
                     help="the event-time field of every stream (default timestamp)")
    eql.add_argument("--time-unit", choices=("s", "ms"), default=None,
                     help="unit of epoch-number times (default: ISO-8601 text or seconds)")
    eql.add_argument("--id-field", default=None, metavar="NAME",
                     help="the field that identifies an event")
    eql.add_argument("--lateness", default=None, metavar="DURATION",
                     help="every stream's lateness, such as 30s")
    eql.add_argument("--ignore-pipe", action="append", default=[], metavar="NAME",
                     help="drop this pipe (head, tail ...) with a comment instead of refusing "
                     "the query: the rule then reports every match")
    eql.set_defaults(handler=_cmd_eql)


def _cmd_eql(args: argparse.Namespace) -> int:
    streams = {}
    for item in args.stream:
        category, sep, name = item.partition("=")
        if not sep or not category or not name:
            raise UsageError(f"--stream wants CATEGORY=NAME, not {item!r}")
        streams[category] = name
    schema = {}
    if args.schema:
        try:
            with open(args.schema, encoding="utf-8") as handle:
                schema = json.load(handle)
        except (OSError, ValueError) as err:
            raise UsageError(f"--schema {args.schema}: {err}") from None
    for path in args.files:
        if not os.path.isfile(path):
            raise UsageError(f"no such file: {path}")
    try:
        options = EqlOptions(
            dialect=args.dialect, case_sensitive=args.case_sensitive, streams=streams,
            any_streams=tuple(s for s in args.any_streams.split(",") if s), schema=schema,
            time_field=args.time_field, time_unit=args.time_unit, id_field=args.id_field,
            lateness=args.lateness, ignore_pipes=frozenset(args.ignore_pipe),
        )
    except ValueError as err:
        raise UsageError(str(err)) from None
    sources, errors = read_sources(args.files)
    result = import_eql(sources, options)
    errors += result.errors
    sys.stdout.write(result.text)
    for err in errors:
        print(err.render(), file=sys.stderr)
    print(f"vigil import eql: {len(result.rules)} rule(s) imported, {len(errors)} refused",
          file=sys.stderr)
    return EXIT_ERRORS if errors else EXIT_OK
