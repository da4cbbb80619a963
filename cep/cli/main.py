"""The ``vigil`` command line: one sub-command per module of this package, dispatched here.

Exit codes follow compilers: 0 clean, 1 errors in the input, 2 a usage problem
(:mod:`cep.cli.arguments`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from cep.cli import (
    alerts,
    check,
    convert,
    demo,
    explain,
    imports,
    pack,
    registry,
    run,
    sample,
    serve,
)
from cep.cli.arguments import EXIT_OK, EXIT_USAGE, UsageError

COMMANDS = (check, explain, run, pack, registry, serve, alerts, sample, demo, imports, convert)
"""The modules whose ``configure_parser`` adds their sub-commands, in the order of ``--help``."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vigil",
        description="Standing rules, queries and metrics over event streams.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for command in COMMANDS:
        command.configure_parser(sub)
    return parser


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

