"""``vigil import sigma FILES``: Sigma rules (and correlation rules) as one Vigil file on
stdout; every rule that has no faithful translation is an error on stderr naming its file and
the construct (exit 1 only when nothing was imported)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from cep.cli.arguments import EXIT_ERRORS, EXIT_OK, UsageError
from cep.engine.validation import compile_errors
from query_lang import check_program
from query_lang.errors import VigilError
from query_lang.imports.sigma import LogSourceMap, import_sigma


def configure_import(formats) -> None:
    """Add ``sigma`` to the formats of ``vigil import``."""
    sigma = formats.add_parser(
        "sigma", help="Sigma rules (YAML, with correlation rules) to a Vigil file",
        description="Translate Sigma rules into one Vigil file on stdout: the streams of their "
        "log sources, then a rule (or metric) per Sigma rule. A rule without a faithful "
        "translation is an error on stderr naming its file and the construct; the others are "
        "still printed. Exit 1 when nothing is imported. See docs/import.md.",
    )
    sigma.add_argument("files", nargs="+", help="Sigma rule files or directories of them")
    sigma.add_argument("--mapping", action="append", default=[], metavar="FILE.yml",
                       help="log sources -> streams, field types, placeholders, over the "
                       "default mapping (repeatable; docs/import.md)")
    sigma.add_argument("-q", "--quiet", action="store_true",
                       help="print only the errors, not the summary line")
    sigma.set_defaults(handler=_cmd_sigma)


def load_mapping(paths: Sequence[str]) -> LogSourceMap:
    """The log-source mapping of ``--mapping`` files; a bad file is a usage error."""
    try:
        return LogSourceMap.load(paths)
    except VigilError as err:
        raise UsageError(str(err)) from None


def _validate(text: str) -> list[VigilError]:
    """What ``vigil check`` reports for ``text``: the checks, then the engine's compilation."""
    program, errors = check_program(text=text)
    return list(errors) or compile_errors(program)


def _cmd_sigma(args: argparse.Namespace) -> int:
    for path in args.files:
        if not os.path.exists(path):
            raise UsageError(f"no such file or directory: {path}")
    result = import_sigma(args.files, load_mapping(args.mapping), validate=_validate)
    sys.stdout.write(result.text)
    for err in result.errors:
        print(err.render(), file=sys.stderr)
    if not args.quiet:
        print(f"vigil import sigma: {result.imported} declaration(s) from {len(result.files)} "
              f"file(s), {len(result.errors)} not imported", file=sys.stderr)
    return EXIT_OK if result.imported else EXIT_ERRORS
