"""Standing queries by name: the registry as the ``/queries`` endpoints see it.

``PUT /queries/NAME`` takes DSL text that defines the rule, query or metric ``NAME`` plus any
stream, list or webhook it brings, and pushes it (:meth:`cep.registry.Registry.push`): checked
against the whole program it would make, stored whole as one version or refused whole with
every error located. A body is self-contained: no ``include``, no list read from a file (the
server's files are not the client's). Changes are serialised here, so that each one is checked
against the program the one before it made.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tempfile
import threading
from typing import Any

from cep.alerts import mask_url
from cep.registry import ChangeRefused, Entry, Registry
from cep.service.problems import Problem, located
from query_lang import ast, parse, parse_recovering, print_declaration
from query_lang.timestamps import format_iso_ms

__all__ = ["BODY", "NamedQueries", "public_text"]

BODY = "<body>"
"""The file name errors in a request's body give."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,199}")
_STANDING = (ast.RuleDecl, ast.QueryDecl, ast.MetricDecl)


class NamedQueries:
    """The ``/queries`` and ``/check`` operations over a registry; each returns the JSON
    answer's body or raises :class:`~cep.service.problems.Problem`."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ reading

    def list(self, kind: str | None = None) -> dict[str, Any]:
        entries = self.registry.store.current()
        return {
            "registry_version": self.registry.version,
            "queries": [
                {"name": e.name, "kind": e.kind, "version": e.version,
                 "href": f"/queries/{e.name}"}
                for e in entries if kind is None or e.kind == kind
            ],
        }

    def get(self, name: str) -> dict[str, Any]:
        entry = self._entry(name)
        return {
            "name": entry.name,
            "kind": entry.kind,
            "version": entry.version,
            "registry_version": self.registry.version,
            "text": public_text(entry),
            "history": f"/queries/{entry.name}/history",
        }

    def history(self, name: str) -> dict[str, Any]:
        rows = self.registry.store.history(name)
        if not rows:
            raise _not_found(name)
        return {
            "name": name,
            "history": [
                {
                    "version": change.version,
                    "at": format_iso_ms(change.at_ms),
                    "author": change.author,
                    "summary": change.summary,
                    "kind": entry.kind,
                    "removed": entry.removed,
                    "text": None if entry.removed else public_text(entry),
                }
                for entry, change in rows
            ],
        }

    def _entry(self, name: str) -> Entry:
        found = self.registry.store.named(name)
        if not found:
            raise _not_found(name)
        # A stream and a rule may share a name: the rule, query or metric is the query.
        found.sort(key=lambda e: e.space != "standing")
        return found[0]

    # ------------------------------------------------------------------ changes

    def put(self, name: str, text: str, author: str) -> tuple[int, dict[str, Any]]:
        """Create or replace ``name``: (201 or 200, the answer)."""
        _check_name(name)
        decls = _declarations(text)
        standing = [d for d in decls if isinstance(d, _STANDING)]
        if len(standing) > 1:
            raise Problem(
                400, "One rule, query or metric per request",
                f"the body defines {len(standing)}: "
                f"{', '.join(d.name for d in standing)}; PUT each under its own name",
                kind="several-definitions",
            )
        if standing and standing[0].name != name:
            raise Problem(
                409, "Name mismatch",
                f"the body defines '{standing[0].name}', not '{name}'", kind="name-mismatch",
            )
        if not any(d.name == name for d in decls):
            raise Problem(409, "Name mismatch", f"the body defines nothing named '{name}'",
                          kind="name-mismatch")
        with self._lock:
            if standing:
                kind = _kind(standing[0])
                taken = [e for e in self.registry.store.named(name)
                         if e.space == "standing" and e.kind != kind]
                if taken:
                    raise Problem(
                        409, "Name taken",
                        f"'{name}' is a {taken[0].kind}; DELETE it before defining a {kind} "
                        "under that name", kind="name-taken",
                    )
            result = self._push(name, text, author, dry_run=False)
        entry = self._entry(name)
        status = 201 if name in result.added else 200
        return status, {
            "name": name,
            "kind": entry.kind,
            "status": "added" if name in result.added else
                      "replaced" if name in result.replaced else "unchanged",
            "version": entry.version,
            "registry_version": self.registry.version,
            "added": result.added,
            "replaced": result.replaced,
            "unchanged": result.unchanged,
        }

    def check(self, text: str, author: str) -> dict[str, Any]:
        """What pushing ``text`` would do, storing nothing."""
        _declarations(text)
        result = self._push("check", text, author, dry_run=True)
        return {
            "ok": True,
            "registry_version": self.registry.version,
            "would_add": result.added,
            "would_replace": result.replaced,
            "unchanged": result.unchanged,
        }

    def delete(self, name: str, author: str) -> dict[str, Any]:
        _check_name(name)
        with self._lock:
            if not self.registry.store.named(name):
                raise _not_found(name)
            try:
                result = self.registry.remove([name], author=author)
            except ChangeRefused as refused:
                raise Problem(
                    409, "Others depend on it",
                    f"removing '{name}' would leave a program that does not check",
                    kind="in-use", errors=located(refused.errors),
                ) from None
        return {"name": name, "removed": result.removed, "registry_version": result.version}

    def _push(self, name: str, text: str, author: str, *, dry_run: bool):
        with tempfile.TemporaryDirectory(prefix="vigil-put-") as directory:
            path = os.path.join(directory, f"{name}.vigil")
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(text)
            try:
                return self.registry.push([path], author=author, dry_run=dry_run)
            except ChangeRefused as refused:
                raise Problem(
                    400, "The program does not check",
                    f"{len(refused.errors)} error(s); nothing was stored",
                    kind="invalid-program", errors=located(refused.errors, {path: BODY}),
                ) from None


def public_text(entry: Entry) -> str | None:
    """An entry's text as the API shows it: a webhook's literal secrets and the credentials
    and query of its URL masked."""
    if entry.text is None or entry.kind != "webhook":
        return entry.text
    decl = parse(entry.text).declarations[0]
    secrets = tuple(dataclasses.replace(s, value="***") if s.value is not None else s
                    for s in decl.secrets)
    return print_declaration(dataclasses.replace(decl, url=mask_url(decl.url), secrets=secrets))


def _declarations(text: str) -> list[ast.Declaration]:
    """The declarations of a body; a syntax error, an include or a list file refused (400)."""
    module, errors = parse_recovering(text, BODY)
    if errors:
        raise Problem(400, "The body does not parse", f"{len(errors)} error(s)",
                      kind="invalid-program", errors=located(errors))
    refused = []
    for decl in module.declarations:
        if isinstance(decl, ast.Include):
            refused.append((decl, "include is not accepted over HTTP: put what it would "
                                  "bring into the body"))
        elif isinstance(decl, ast.ListDecl) and decl.path is not None:
            refused.append((decl, f"list '{decl.name}' reads a file: give its values inline "
                                  "over HTTP"))
    if refused:
        raise Problem(
            400, "The body is not self-contained", f"{len(refused)} error(s)",
            kind="invalid-program",
            errors=[{"file": BODY, "line": d.span.line, "column": d.span.column,
                     "message": message} for d, message in refused],
        )
    return list(module.declarations)


def _kind(decl: ast.Declaration) -> str:
    return {ast.RuleDecl: "rule", ast.QueryDecl: "query", ast.MetricDecl: "metric"}[type(decl)]


def _check_name(name: str) -> None:
    if not _NAME.fullmatch(name):
        raise Problem(400, "Bad name", f"{name[:60]!r} is not a name (a letter or _, then "
                      "letters, digits or _)", kind="bad-name")


def _not_found(name: str) -> Problem:
    return Problem(404, "Not found", f"nothing named '{name}' is registered",
                   kind="not-found")
