"""``vigil convert evtx-json FILE``: Windows event logs as evtx_dump writes them in JSON, as
Vigil events (JSON lines) of the streams ``vigil import sigma`` declares for their log
sources."""

from __future__ import annotations

import argparse
import json
import sys

from cep.cli.arguments import EXIT_ERRORS, EXIT_OK, UsageError
from cep.cli.sigma_import import load_mapping
from query_lang import ast, parse
from query_lang.errors import VigilError
from query_lang.imports.sigma import convert_evtx_json
from query_lang.includes import read_named_file


def configure_parser(sub) -> None:
    convert = sub.add_parser("convert", help="convert events of other tools to Vigil events")
    formats = convert.add_subparsers(dest="convert_format", metavar="FORMAT")
    formats.required = True
    evtx = formats.add_parser(
        "evtx-json", help="Windows event logs (evtx_dump JSON) to Vigil events (JSON lines)",
        description="Read Windows event-log records in evtx_dump's JSON form (concatenated "
        '{"Event": {"System": ..., "EventData": ...}} objects) and print one Vigil event '
        "per record and stream it belongs to, in time order, for the streams `vigil import "
        "sigma` declares (the same --mapping). Records of no mapped log source are counted "
        "on stderr.",
    )
    evtx.add_argument("files", nargs="+", help="evtx JSON files (- for stdin)")
    evtx.add_argument("--mapping", action="append", default=[], metavar="FILE.yml",
                      help="the log-source mapping given to `vigil import sigma`")
    evtx.add_argument("--streams-of", metavar="RULES.vigil",
                      help="write only events of the streams this rule file declares (a "
                      "Sysmon process creation is also a `windows_sysmon` event, which `vigil "
                      "run` counts as bad when its file does not declare that stream)")
    evtx.set_defaults(handler=_cmd_evtx)


def _declared_streams(path: str) -> set[str]:
    try:
        module = parse(read_named_file(path, ast.Span(path)), path)
    except VigilError as err:
        raise UsageError(f"--streams-of: {err}") from None
    return {d.name for d in module.declarations if isinstance(d, ast.StreamDecl)}


def _cmd_evtx(args: argparse.Namespace) -> int:
    mapping = load_mapping(args.mapping)
    wanted = _declared_streams(args.streams_of) if args.streams_of else None
    status = EXIT_OK
    for path in args.files:
        try:
            if path == "-":
                text = sys.stdin.read()
            else:
                with open(path, encoding="utf-8") as handle:
                    text = handle.read()
        except (OSError, UnicodeDecodeError) as err:
            print(f"vigil convert: {path}: {err}", file=sys.stderr)
            status = EXIT_ERRORS
            continue
        try:
            result = convert_evtx_json(text, mapping, origin=path)
        except VigilError as err:
            print(err.render(), file=sys.stderr)
            status = EXIT_ERRORS
            continue
        for event in result.events:
            if wanted is not None and event["stream"] not in wanted:
                continue
            sys.stdout.write(json.dumps(event, ensure_ascii=False) + "\n")
        for where, count in sorted(result.unmapped.items()):
            print(f"vigil convert: {path}: {count} record(s) of {where} belong to no mapped "
                  "log source", file=sys.stderr)
        if result.dropped_values:
            print(f"vigil convert: {path}: {result.dropped_values} value(s) left out: not of "
                  "the type the mapping declares", file=sys.stderr)
    return status
