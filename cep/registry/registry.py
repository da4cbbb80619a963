"""The registry of standing queries: changes checked against the whole program they would make,
accepted whole or refused whole.

A push takes rule files (their includes and list files read as ``vigil check`` reads them) and
adds or replaces every declaration they define; a removal takes names. Either way the program
that would result is checked as ``vigil check`` checks a program — the language's checks, then
the engine's compilers (:func:`cep.engine.validation.compile_errors`) — and a change with any
error is refused with every error located (in the pushed files where they are, else in the
registry's text at its version). Declarations are stored in canonical form
(:func:`query_lang.printer.print_declaration`); a list read from a file is stored with its
values inline, so that a registry holds everything its program needs.
"""

from __future__ import annotations

import getpass
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from cep.engine.validation import compile_errors
from cep.registry.store import STANDING, Entry, RegistryStore
from query_lang import Program, VigilError, ast, check_program
from query_lang.errors import IncludeError, VigilSyntaxError
from query_lang.includes import read_list_file
from query_lang.printer import print_declaration

__all__ = ["ChangeRefused", "ChangeResult", "Registry", "space_of"]

_KINDS: dict[type, tuple[str, str]] = {
    ast.StreamDecl: ("stream", "stream"),
    ast.ListDecl: ("list", "list"),
    ast.TableDecl: ("table", "table"),
    ast.WebhookDecl: ("webhook", "webhook"),
    ast.RuleDecl: (STANDING, "rule"),
    ast.QueryDecl: (STANDING, "query"),
    ast.MetricDecl: (STANDING, "metric"),
}


def space_of(decl: ast.Declaration) -> tuple[str, str]:
    """(name space, kind) of a declaration."""
    return _KINDS[type(decl)]


class ChangeRefused(Exception):
    """A change the registry refused: ``errors`` are the located errors of the program it
    would have made (or of the request: an unknown name)."""

    def __init__(self, errors: Sequence[VigilError]) -> None:
        self.errors = list(errors)
        super().__init__("\n".join(e.render() for e in self.errors))


@dataclass
class ChangeResult:
    """What a change did: the version it made (``None`` when it changed nothing or was a dry
    run) and the names it added, replaced, removed or found unchanged."""

    version: int | None
    added: list[str] = field(default_factory=list)
    replaced: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.added or self.replaced or self.removed)


class Registry:
    """The registry at ``path`` (a SQLite file, created when missing).

    Examples
    --------
    >>> import os, tempfile
    >>> directory = tempfile.mkdtemp()
    >>> path = os.path.join(directory, "fraud.vigil")
    >>> with open(path, "w") as f:
    ...     _ = f.write("stream txn (card string, amount float, ts timestamp) time ts\\n"
    ...                 "rule big from txn by card pattern b define b as amount > 500\\n")
    >>> registry = Registry(os.path.join(directory, "registry.sqlite"))
    >>> result = registry.push([path], author="ana")
    >>> result.version, result.added
    (1, ['txn', 'big'])
    >>> registry.push([path], author="ana").unchanged
    ['txn', 'big']
    >>> registry.remove(["txn"], author="ana")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    cep.registry.registry.ChangeRefused: <registry v1>:2:8: error: undeclared stream 'txn'
    ...
    >>> registry.close()
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.store = RegistryStore(path)

    @property
    def path(self) -> str:
        return self.store.path

    @property
    def version(self) -> int:
        return self.store.version

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Registry:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ reading

    def text(self, version: int | None = None) -> str:
        """The program at ``version`` (default: the newest) as one rule file."""
        return _joined(e.text for e in self.store.current(version))

    def program(self, version: int | None = None) -> Program:
        """The program at ``version``, loaded (it was checked when it was written)."""
        upto = self.version if version is None else version
        program, errors = check_program(text=self.text(upto), text_path=f"<registry v{upto}>")
        if errors:  # a registry written by this code is always clean; say so if it is not
            raise ChangeRefused(errors)
        return program

    # ------------------------------------------------------------------ changes

    def push(
        self, paths: Sequence[str], *, author: str | None = None, dry_run: bool = False
    ) -> ChangeResult:
        """Add or replace every declaration the rule files ``paths`` define, as one version.

        Raises
        ------
        ChangeRefused
            With every error of the files or of the program they would make.
        """
        loaded, errors = check_program(list(paths))
        parse_errors = [e for e in errors if _is_syntax(e)]
        if parse_errors:
            raise ChangeRefused(parse_errors)
        incoming: dict[tuple[str, str], Entry] = {}
        for module in loaded.modules:
            for decl in module.declarations:
                if isinstance(decl, ast.Include):
                    continue
                space, kind = space_of(decl)
                incoming[(space, decl.name)] = Entry(space, decl.name, kind, 0, _canonical(decl))
        shared = self.store.current(shared=True)
        current = {(e.space, e.name): e for e in shared}
        for name in {name for space, name in incoming if space == STANDING}:
            current.update(((e.space, e.name), e) for e in self.store.named(name))
        if _changes_shared(incoming.values(), current):
            # A stream, list or webhook changes: checked with every rule that may read it.
            rest = [e for e in self.store.current() if (e.space, e.name) not in incoming]
        else:
            # Only rules, queries and metrics change, and none of them reads another: they are
            # checked and compiled with the streams, lists and webhooks, not with the thousands
            # of others (whose names they replace, being in one name space).
            rest = [e for key, e in current.items() if key not in incoming
                    and e.space != STANDING]
        version = self.version
        program, errors = check_program(
            list(paths), text=_joined(e.text for e in rest) or None,
            text_path=f"<registry v{version}>",
        )
        errors = errors or compile_errors(program)
        if errors:
            raise ChangeRefused(errors)
        result = ChangeResult(None)
        writes = []
        for key, entry in incoming.items():
            before = current.get(key)
            if before is None:
                result.added.append(entry.name)
            elif before.text != entry.text or before.kind != entry.kind:
                result.replaced.append(entry.name)
            else:
                result.unchanged.append(entry.name)
                continue
            writes.append(entry)
        if writes and not dry_run:
            summary = "push " + ", ".join(os.path.basename(p) for p in paths)
            result.version = self.store.write(writes, author=_author(author), summary=summary)
        return result

    def remove(
        self, names: Sequence[str], *, author: str | None = None, dry_run: bool = False
    ) -> ChangeResult:
        """Remove the declarations named ``names`` (any kind), as one version.

        Raises
        ------
        ChangeRefused
            When a name is not registered, or the program without them would not check
            (a rule still reads a stream being removed ...).
        """
        by_name = {name: self.store.named(name) for name in names}
        unknown = [n for n in names if not by_name[n]]
        if unknown:
            raise ChangeRefused([VigilError(
                f"not in the registry: {', '.join(unknown)} (see `vigil registry list`)"
            )])
        going = {(e.space, e.name): e for n in names for e in by_name[n]}
        version = self.version
        if any(space != STANDING for space, _ in going):
            # Nothing reads a rule, query or metric; a stream, list or webhook may be read.
            rest = [e for e in self.store.current() if (e.space, e.name) not in going]
            program, errors = check_program(
                text=_joined(e.text for e in rest), text_path=f"<registry v{version}>"
            )
            errors = errors or compile_errors(program)
            if errors:
                raise ChangeRefused(errors)
        result = ChangeResult(None, removed=[name for _, name in sorted(going)])
        if not dry_run:
            removals = [Entry(e.space, e.name, e.kind, 0, None) for e in going.values()]
            result.version = self.store.write(
                removals, author=_author(author), summary="remove " + ", ".join(names)
            )
        return result

    def export(self, directory: str, version: int | None = None) -> list[str]:
        """Write the program at ``version`` as rule files: ``declarations.vigil`` (streams,
        lists, webhooks) and one file per rule, query or metric including it. Pushing the
        directory back changes nothing. Returns the paths written."""
        os.makedirs(directory, exist_ok=True)
        entries = self.store.current(version)
        shared = [e for e in entries if e.space != STANDING]
        written = [os.path.join(directory, "declarations.vigil")]
        with open(written[0], "w", encoding="utf-8") as handle:
            handle.write(_joined(e.text for e in shared))
        for entry in entries:
            if entry.space != STANDING:
                continue
            path = os.path.join(directory, f"{entry.name}.vigil")
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(_joined(['include "declarations.vigil"', entry.text]))
            written.append(path)
        return written


def _changes_shared(incoming: Iterable[Entry], current: dict[tuple[str, str], Entry]) -> bool:
    """Whether ``incoming`` adds or changes a stream, list or webhook of ``current``."""
    for entry in incoming:
        if entry.space != STANDING:
            before = current.get((entry.space, entry.name))
            if before is None or before.text != entry.text:
                return True
    return False


def _canonical(decl: ast.Declaration) -> str:
    """A declaration's stored text: canonical, a list file's values inline."""
    if isinstance(decl, ast.ListDecl) and decl.path is not None:
        # One value a line, blank lines ignored: as the engine reads the file.
        lines = (line.strip() for line in read_list_file(decl).split("\n"))
        decl = ast.ListDecl(decl.name, None, tuple(dict.fromkeys(v for v in lines if v)),
                            decl.span)
    return print_declaration(decl)


def _joined(texts) -> str:
    parts = [t.strip("\n") for t in texts if t]
    return "\n\n".join(parts) + "\n" if parts else ""


def _is_syntax(err: VigilError) -> bool:
    return isinstance(err, VigilSyntaxError | IncludeError)


def _author(author: str | None) -> str:
    if author:
        return author
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"
