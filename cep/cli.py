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

    for module_name in ("cep.explain", "cep.run", "cep.alerting", "cep.sample"):
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
