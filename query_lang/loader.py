"""Loading a program: rule files, their ``include``s, and the checks over all of them.

A *program* is every declaration of the files given plus the files they include (each file
loaded once, however often it is included); names are resolved across the whole program.
Includes read only rule files: inside the directory of a file given or an include root
(:mod:`query_lang.includes`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from query_lang import ast
from query_lang.checks import check_declarations
from query_lang.errors import ErrorList, IncludeError, VigilError, VigilLimitError
from query_lang.includes import (
    check_list_file,
    default_include_roots,
    read_included_file,
    read_named_file,
    require_within_roots,
)
from query_lang.limits import MAX_INCLUDE_DEPTH
from query_lang.parser import parse_recovering


@dataclass
class Program:
    """A checked set of declarations, indexed by name.

    Attributes
    ----------
    modules:
        The parsed files in load order (includes before the files that include them).
    sources:
        File path -> text, so errors can show the offending line.
    """

    modules: list[ast.Module] = field(default_factory=list)
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def declarations(self) -> list[ast.Declaration]:
        return [d for m in self.modules for d in m.declarations if not isinstance(d, ast.Include)]

    def _named(self, kind: type) -> dict:
        return {d.name: d for d in self.declarations if isinstance(d, kind)}

    @property
    def streams(self) -> dict[str, ast.StreamDecl]:
        return self._named(ast.StreamDecl)

    @property
    def lists(self) -> dict[str, ast.ListDecl]:
        return self._named(ast.ListDecl)

    @property
    def tables(self) -> dict[str, ast.TableDecl]:
        return self._named(ast.TableDecl)

    @property
    def webhooks(self) -> dict[str, ast.WebhookDecl]:
        return self._named(ast.WebhookDecl)

    @property
    def rules(self) -> dict[str, ast.RuleDecl]:
        return self._named(ast.RuleDecl)

    @property
    def queries(self) -> dict[str, ast.QueryDecl]:
        return self._named(ast.QueryDecl)

    @property
    def metrics(self) -> dict[str, ast.MetricDecl]:
        return self._named(ast.MetricDecl)

    def with_webhook_urls(self, urls: Mapping[str, str]) -> Program:
        """This program with the webhooks named in ``urls`` sending to the URL given there
        instead of their declared one (a staging receiver, a local one); nothing else changes.

        Raises
        ------
        KeyError
            Naming a webhook the program does not declare.
        """
        unknown = sorted(set(urls) - set(self.webhooks))
        if unknown:
            declared = ", ".join(sorted(self.webhooks)) or "none"
            raise KeyError(f"no webhook {', '.join(unknown)} is declared (declared: {declared})")

        def moved(decl: ast.Declaration) -> ast.Declaration:
            if isinstance(decl, ast.WebhookDecl) and decl.name in urls:
                return replace(decl, url=urls[decl.name])
            return decl

        modules = [replace(m, declarations=tuple(map(moved, m.declarations)))
                   for m in self.modules]
        return Program(modules, dict(self.sources))


class _Loader:
    def __init__(self, roots: list[str]) -> None:
        self.program = Program()
        self.errors: list[VigilError] = []
        self.loaded: set[str] = set()
        self.stack: list[str] = []
        self.roots = roots

    def load_file(self, path: str, include: ast.Include | None = None) -> None:
        key = os.path.realpath(path)
        where = include.span if include else ast.Span(path)
        try:
            if include is not None:
                # Before anything else: a path outside the roots is refused, whatever it is.
                require_within_roots(path, key, self.roots, where)
            if key in self.stack:
                cycle = " -> ".join(os.path.relpath(p) for p in self.stack[self.stack.index(key):])
                raise IncludeError(f"include cycle: {cycle} -> {os.path.relpath(key)}", where)
            if key in self.loaded:
                return
            if include is not None and len(self.stack) >= MAX_INCLUDE_DEPTH:
                self.errors.append(VigilLimitError(
                    f"cannot include {path}: a chain of more than {MAX_INCLUDE_DEPTH} included "
                    "files (include depth)",
                    where, limit="MAX_INCLUDE_DEPTH", value=len(self.stack) + 1,
                ))
                return
            if include is None:
                text = read_named_file(path, where)
            else:
                text = read_included_file(path, key, where)
        except IncludeError as err:
            self.errors.append(err)
            return
        self.loaded.add(key)
        self.load_text(text, path, key)

    def load_text(self, text: str, path: str, key: str | None = None) -> None:
        self.program.sources[path] = text
        module, errors = parse_recovering(text, path)
        self.errors.extend(errors)
        self.stack.append(key or path)
        base = _base_directory(path)
        for decl in module.declarations:
            if isinstance(decl, ast.Include):
                self.load_file(os.path.normpath(os.path.join(base, decl.path)), decl)
            elif isinstance(decl, ast.ListDecl) and decl.path is not None:
                # As the engine will read it (query_lang.includes.read_list_file).
                try:
                    check_list_file(decl)
                except IncludeError as err:
                    self.errors.append(err)
        self.stack.pop()
        self.program.modules.append(module)


def _base_directory(path: str) -> str:
    """The directory the includes of ``path`` are relative to (text: the working directory)."""
    return os.path.dirname(path) if path != "<string>" else os.getcwd()


def check_program(
    paths: list[str] | None = None,
    *,
    text: str | None = None,
    text_path: str = "<string>",
    include_roots: Sequence[str | os.PathLike[str]] | None = None,
) -> tuple[Program, list[VigilError]]:
    """Load files (and/or one text) with their includes and check them all.

    Returns the program and every error found (syntax, include and semantic), each with its
    source text attached so it can render the offending line.

    An ``include`` may read a file below the directory of one of ``paths`` (of ``text``: the
    working directory) or below one of ``include_roots``, symlinks and ``..`` resolved; it
    must be a regular file of at most 16 MiB. ``include_roots`` defaults to the directories in
    ``$VIGIL_INCLUDE_PATH`` (:func:`query_lang.includes.default_include_roots`).

    Examples
    --------
    >>> program, errors = check_program(text=(
    ...     "stream txn (amount float, ts timestamp) time ts\\n"
    ...     "rule big from txn pattern a define a as amout > 500\\n"
    ... ))
    >>> list(program.rules)
    ['big']
    >>> print(errors[0].render())
    <string>:2:41: error: undeclared field 'amout': not a field of the stream
      rule big from txn pattern a define a as amout > 500
                                              ^
    """
    if include_roots is None:
        include_roots = default_include_roots()
    entries = [*(paths or []), *([text_path] if text is not None else [])]
    roots = [os.fspath(root) for root in include_roots]
    roots += [_base_directory(path) or os.curdir for path in entries]
    loader = _Loader(list(dict.fromkeys(os.path.realpath(root) for root in roots)))
    for path in paths or []:
        loader.load_file(path)
    if text is not None:
        loader.load_text(text, text_path)
    errors = loader.errors + check_declarations(loader.program.declarations, loader.program.sources)
    for err in errors:
        if err.source is None and err.span is not None:
            err.source = loader.program.sources.get(err.span.file)
    errors.sort(key=lambda e: (e.file or "", e.line, e.column))
    return loader.program, errors


def load_program(
    paths: list[str] | None = None,
    *,
    text: str | None = None,
    text_path: str = "<string>",
    include_roots: Sequence[str | os.PathLike[str]] | None = None,
) -> Program:
    """Like :func:`check_program`, but raises :class:`ErrorList` when there is any error."""
    program, errors = check_program(
        paths, text=text, text_path=text_path, include_roots=include_roots
    )
    if errors:
        raise ErrorList(errors)
    return program
