"""Where an ``include`` may read from, and how a rule file is read.

A rule file can only read rule files: an include resolves (symlinks and ``..`` followed) inside
the directory of a file the caller named or inside an *include root*, names a regular file, and
holds at most :data:`MAX_RULE_FILE_BYTES`. A refusal is an :class:`IncludeError` naming the path
and the reason, never anything the refused file holds.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

from query_lang.ast import ListDecl, Span
from query_lang.errors import IncludeError

__all__ = [
    "INCLUDE_PATH_VARIABLE",
    "MAX_LIST_FILE_BYTES",
    "MAX_RULE_FILE_BYTES",
    "check_list_file",
    "default_include_roots",
    "list_file",
    "read_list_file",
    "read_included_file",
    "read_named_file",
    "require_within_roots",
]

MAX_RULE_FILE_BYTES = 16 * 1024 * 1024
"""The largest rule file read (16 MiB); a larger one is an error, read no further than this."""

MAX_LIST_FILE_BYTES = 1 << 30
"""The largest ``list ... from`` file read (1 GiB: tens of millions of values, held in a Bloom
filter); a larger one is an error, read no further than this."""

INCLUDE_PATH_VARIABLE = "VIGIL_INCLUDE_PATH"
"""The environment variable listing include roots, separated by ``os.pathsep``."""

_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a named pipe"),
    (stat.S_ISSOCK, "a socket"),
)


def default_include_roots(environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """The include roots when the caller gives none: the directories listed in
    ``VIGIL_INCLUDE_PATH`` (none when it is unset or empty). The directories of the files a
    caller names are roots in any case; the working directory is not, so where a process runs
    never widens what its rule files may read."""
    environ = os.environ if environ is None else environ
    listed = environ.get(INCLUDE_PATH_VARIABLE) or ""
    return tuple(root for root in listed.split(os.pathsep) if root)


def read_named_file(path: str, where: Span) -> str:
    """The text of a rule file the caller named: any readable file (``/dev/stdin`` too), read
    no further than the size cap.

    Raises
    ------
    IncludeError
        At ``where``, when the file is missing, unreadable, too large or not UTF-8.
    """
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_RULE_FILE_BYTES + 1)
    except FileNotFoundError:
        raise IncludeError(f"file not found: {path}", where) from None
    except OSError as err:
        raise IncludeError(f"cannot read {path}: {_reason(err)}", where) from None
    return _decode(data, f"cannot read {path}", where)


def require_within_roots(
    path: str, real: str, roots: Sequence[str], where: Span, *, refused: str | None = None
) -> None:
    """Refuse an included path that lies outside every root.

    Parameters
    ----------
    path:
        The included path as the including file names it, joined to that file's directory:
        what messages show.
    real:
        ``os.path.realpath(path)``: what is checked (and later opened).
    roots:
        Real paths of the directories includes may read from (and below).
    where:
        The span of the ``include``.
    refused:
        What the message says was refused (default ``cannot include PATH``).

    Raises
    ------
    IncludeError
        At ``where``, naming the path, what it resolves to and the roots.
    """
    if any(_inside(real, root) for root in roots):
        return
    resolved = f" (it resolves to {real})" if real != os.path.abspath(path) else ""
    refused = refused or f"cannot include {path}"
    raise IncludeError(
        f"{refused}{resolved}: outside the directories rule files may include "
        f"from ({', '.join(roots) or 'none'}); {INCLUDE_PATH_VARIABLE} adds more",
        where,
    )


def read_included_file(
    path: str,
    real: str,
    where: Span,
    *,
    cap: int | None = None,
    refused: str | None = None,
) -> str:
    """The text of the file an ``include`` (or a ``list ... from``) names, once
    :func:`require_within_roots` passed: a regular file of at most ``cap`` bytes, opened by its
    real path.

    Raises
    ------
    IncludeError
        At ``where`` (the ``include``), when the file is missing, is not a regular file, is
        larger than the cap or is not UTF-8; ``refused`` (default ``cannot include PATH``)
        starts the message.
    """
    cap = MAX_RULE_FILE_BYTES if cap is None else cap
    with _open_checked(path, real, where, cap, refused) as handle:
        data = handle.read(cap + 1)
    return _decode(data, refused or f"cannot include {path}", where, cap)


def _open_checked(path: str, real: str, where: Span, cap: int, refused: str | None):
    """``real`` opened for reading once it is known to be a regular file within ``cap``."""
    missing = f"{refused}: file not found" if refused else f"included file not found: {path}"
    refused = refused or f"cannot include {path}"
    try:
        before = os.stat(real)
    except FileNotFoundError:
        raise IncludeError(missing, where) from None
    except OSError as err:
        raise IncludeError(f"{refused}: {_reason(err)}", where) from None
    # Refused before opening: opening a device or a pipe can block or act.
    _require_rule_file(before, refused, where, cap)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(real, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError as err:
        raise IncludeError(f"{refused}: {_reason(err)}", where) from None
    handle = os.fdopen(fd, "rb")
    opened = os.fstat(handle.fileno())
    try:
        if (opened.st_dev, opened.st_ino) != (before.st_dev, before.st_ino):
            raise IncludeError(f"{refused}: it changed while being opened", where)
        _require_rule_file(opened, refused, where, cap)
    except IncludeError:
        handle.close()
        raise
    return handle


def list_file(decl: ListDecl) -> tuple[str, str, str]:
    """Where a ``list NAME from "path"`` reads, as an include is read: the path (relative to
    the declaring file, for messages), its real path, and what a refusal says; refused when it
    lies outside the declaring file's directory and the include roots.

    Raises
    ------
    IncludeError
        At the declaration, when the path lies outside every root.
    """
    declared_in = decl.span.file
    home = Path(declared_in).parent if declared_in and declared_in != "<string>" else Path()
    path = Path(decl.path or "")
    if not path.is_absolute():
        path = home / path
    real = os.path.realpath(path)
    roots = [os.path.realpath(root) for root in (home, *default_include_roots())]
    refused = f"cannot read list '{decl.name}' from {str(path)!r}"
    require_within_roots(str(path), real, roots, decl.span, refused=refused)
    return str(path), real, refused


def read_list_file(decl: ListDecl) -> str:
    """The text of a ``list ... from`` file (:func:`list_file`), at most
    :data:`MAX_LIST_FILE_BYTES`.

    Raises
    ------
    IncludeError
        At the declaration, when the file is refused, missing, not a regular file, too large or
        not UTF-8.
    """
    path, real, refused = list_file(decl)
    return read_included_file(path, real, decl.span, cap=MAX_LIST_FILE_BYTES, refused=refused)


def check_list_file(decl: ListDecl) -> None:
    """What ``vigil check`` learns of a ``list ... from`` file without reading it: that
    :func:`read_list_file` will find it within the roots, a regular file it may open, within
    the size cap. (Whether it is UTF-8 only reading it tells.)

    Raises
    ------
    IncludeError
        As :func:`read_list_file` does.
    """
    path, real, refused = list_file(decl)
    _open_checked(path, real, decl.span, MAX_LIST_FILE_BYTES, refused).close()


def _inside(real: str, root: str) -> bool:
    try:
        return os.path.commonpath([real, root]) == root
    except ValueError:  # different drives
        return False


def _require_rule_file(info: os.stat_result, refused: str, where: Span, cap: int) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
        raise IncludeError(f"{refused}: not a regular file ({kind})", where)
    if info.st_size > cap:
        raise IncludeError(f"{refused}: {info.st_size:,} bytes, {_over_cap(cap)}", where)


def _over_cap(cap: int | None = None) -> str:
    if cap is None or cap == MAX_RULE_FILE_BYTES:
        return f"over the {MAX_RULE_FILE_BYTES:,}-byte limit of a rule file"
    return f"over the {cap:,}-byte limit"


def _decode(data: bytes, refused: str, where: Span, cap: int | None = None) -> str:
    # The size a file reports can lie (/proc) or change while it is read.
    cap = MAX_RULE_FILE_BYTES if cap is None else cap
    if len(data) > cap:
        raise IncludeError(f"{refused}: {_over_cap(cap)}", where)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise IncludeError(f"{refused}: not UTF-8 text (line {line})", where) from None
    # As reading in text mode did: universal newlines.
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _reason(err: OSError) -> str:
    return err.strerror or type(err).__name__
