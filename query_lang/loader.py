"""Loading a program: rule files, their ``include``s, and the checks over all of them.

A *program* is every declaration of the files given plus the files they include (each file
loaded once, however often it is included); names are resolved across the whole program.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from query_lang import ast
from query_lang.checks import check_declarations
from query_lang.errors import ErrorList, IncludeError, VigilError
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


class _Loader:
    def __init__(self) -> None:
        self.program = Program()
        self.errors: list[VigilError] = []
        self.loaded: set[str] = set()
        self.stack: list[str] = []

    def load_file(self, path: str, include: ast.Include | None = None) -> None:
        key = os.path.realpath(path)
        if key in self.stack:
            cycle = " -> ".join(os.path.relpath(p) for p in self.stack[self.stack.index(key):])
            self.errors.append(
                IncludeError(f"include cycle: {cycle} -> {os.path.relpath(key)}", include.span)
            )
            return
        if key in self.loaded:
            return
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except FileNotFoundError:
            where = include.span if include else ast.Span(path)
            what = f"included file not found: {path}" if include else f"file not found: {path}"
            self.errors.append(IncludeError(what, where))
            return
        except (OSError, UnicodeDecodeError) as err:
            where = include.span if include else ast.Span(path)
            self.errors.append(IncludeError(f"cannot read {path}: {err}", where))
            return
        self.loaded.add(key)
        self.load_text(text, path, key)

    def load_text(self, text: str, path: str, key: str | None = None) -> None:
        self.program.sources[path] = text
        module, errors = parse_recovering(text, path)
        self.errors.extend(errors)
        self.stack.append(key or path)
        base = os.path.dirname(path) if path != "<string>" else os.getcwd()
        for decl in module.declarations:
            if isinstance(decl, ast.Include):
                self.load_file(os.path.normpath(os.path.join(base, decl.path)), decl)
        self.stack.pop()
        self.program.modules.append(module)


def check_program(
    paths: list[str] | None = None, *, text: str | None = None, text_path: str = "<string>"
) -> tuple[Program, list[VigilError]]:
    """Load files (and/or one text) with their includes and check them all.

    Returns the program and every error found (syntax, include and semantic), each with its
    source text attached so it can render the offending line.

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
    loader = _Loader()
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


def load_program(paths: list[str] | None = None, *, text: str | None = None,
                 text_path: str = "<string>") -> Program:
    """Like :func:`check_program`, but raises :class:`ErrorList` when there is any error."""
    program, errors = check_program(paths, text=text, text_path=text_path)
    if errors:
        raise ErrorList(errors)
    return program
