"""What every ``vigil`` command shares about its command line: exit codes, the usage error, and
how rule-file arguments expand.

Exit codes follow compilers: 0 clean, 1 errors in the input, 2 a usage problem.
"""

from __future__ import annotations

import argparse
import glob
import os
from collections.abc import Sequence

from query_lang.errors import VigilError

EXIT_OK, EXIT_ERRORS, EXIT_USAGE = 0, 1, 2


class UsageError(VigilError):
    """The command line itself is wrong (missing file, bad option, unknown stream)."""


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


def positive_int(text: str) -> int:
    """An ``argparse`` type: a positive integer, or a usage error naming the text."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value
