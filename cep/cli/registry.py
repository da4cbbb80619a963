"""``vigil registry``: the registry of standing queries from a shell — push rule files, remove,
export, list, show the history of a name and which version running engines apply.

Every command takes ``--registry PATH`` (default ``$VIGIL_REGISTRY``, else
``.vigil/registry.sqlite``). A refused change prints every error located and exits 1; nothing
of it is stored.
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime

from cep.cli.arguments import EXIT_ERRORS, EXIT_OK, UsageError, expand_rule_paths
from cep.registry import ChangeRefused, ChangeResult, Registry, RegistryError

DEFAULT_REGISTRY = os.path.join(".vigil", "registry.sqlite")


def default_registry() -> str:
    """``$VIGIL_REGISTRY``, else ``.vigil/registry.sqlite``."""
    return os.environ.get("VIGIL_REGISTRY") or DEFAULT_REGISTRY


def configure_parser(sub) -> None:
    parser = sub.add_parser("registry", help="the registry of standing queries")
    actions = parser.add_subparsers(dest="registry_command", metavar="ACTION")
    actions.required = True

    def action(name: str, help_text: str, handler) -> argparse.ArgumentParser:
        p = actions.add_parser(name, help=help_text)
        p.add_argument("--registry", default=None, metavar="PATH",
                       help="the registry file (default $VIGIL_REGISTRY or "
                       ".vigil/registry.sqlite)")
        p.set_defaults(handler=handler)
        return p

    push = action("push", "add or replace what rule files define (one version, all or nothing)",
                  _cmd_push)
    push.add_argument("files", nargs="+", help="rule files, directories or glob patterns")
    push.add_argument("--author", help="who makes the change (default: the user name)")
    push.add_argument("--dry-run", action="store_true", help="check and report, store nothing")
    rm = action("rm", "remove rules, queries, metrics or declarations by name", _cmd_rm)
    rm.add_argument("names", nargs="+")
    rm.add_argument("--author")
    export = action("export", "write the program as rule files into a directory", _cmd_export)
    export.add_argument("directory")
    export.add_argument("--version", type=int, help="a past version (default: the newest)")
    listing = action("list", "the registered declarations", _cmd_list)
    listing.add_argument("--version", type=int, help="a past version (default: the newest)")
    history = action("history", "every version of a name: when, who, and the text", _cmd_history)
    history.add_argument("name")
    action("status", "the newest version and what running engines apply", _cmd_status)


def _open(args: argparse.Namespace, *, must_exist: bool = True) -> Registry:
    path = args.registry or default_registry()
    if must_exist and not os.path.exists(path):
        raise UsageError(f"no registry at {path} (`vigil registry push FILES --registry "
                         f"{path}` creates it)")
    try:
        return Registry(path)
    except RegistryError as err:
        raise UsageError(str(err)) from None


def _refused(err: ChangeRefused) -> int:
    for error in err.errors:
        print(error.render(), file=sys.stderr)
    print(f"vigil registry: refused, nothing stored ({len(err.errors)} error(s))",
          file=sys.stderr)
    return EXIT_ERRORS


def _report(result: ChangeResult, registry: Registry, dry_run: bool = False) -> None:
    parts = [f"{label}: {', '.join(names)}" for label, names in (
        ("added", result.added), ("replaced", result.replaced), ("removed", result.removed),
        ("unchanged", result.unchanged)) if names]
    if dry_run:
        head = "would make a new version" if result.changed else "would change nothing"
    elif result.version is None:
        head = f"nothing changed (version {registry.version})"
    else:
        head = f"version {result.version}"
    print(f"{registry.path}: {head}" + (f" — {'; '.join(parts)}" if parts else ""))


def _cmd_push(args: argparse.Namespace) -> int:
    paths = expand_rule_paths(args.files)
    with _open(args, must_exist=False) as registry:
        try:
            result = registry.push(paths, author=args.author, dry_run=args.dry_run)
        except ChangeRefused as err:
            return _refused(err)
        _report(result, registry, args.dry_run)
    return EXIT_OK


def _cmd_rm(args: argparse.Namespace) -> int:
    with _open(args) as registry:
        try:
            result = registry.remove(args.names, author=args.author)
        except ChangeRefused as err:
            return _refused(err)
        _report(result, registry)
    return EXIT_OK


def _cmd_export(args: argparse.Namespace) -> int:
    with _open(args) as registry:
        written = registry.export(args.directory, args.version)
    print(f"wrote {len(written)} file(s) to {args.directory}")
    return EXIT_OK


def _cmd_list(args: argparse.Namespace) -> int:
    with _open(args) as registry:
        entries = registry.store.current(args.version)
        version = registry.version if args.version is None else args.version
    print(f"{'name':<28} {'kind':<8} {'version':>7}")
    for entry in entries:
        print(f"{entry.name:<28} {entry.kind:<8} {entry.version:>7}")
    print(f"({len(entries)} declaration(s) at version {version})")
    return EXIT_OK


def _cmd_history(args: argparse.Namespace) -> int:
    with _open(args) as registry:
        rows = registry.store.history(args.name)
    if not rows:
        raise UsageError(f"{args.name!r} was never in the registry")
    for entry, change in rows:
        what = "removed" if entry.removed else entry.kind
        print(f"version {change.version}  {_when(change.at_ms)}  {change.author}  {what}  "
              f"({change.summary})")
        if entry.text is not None:
            print("  " + entry.text.replace("\n", "\n  "))
    return EXIT_OK


def _cmd_status(args: argparse.Namespace) -> int:
    with _open(args) as registry:
        changes = registry.store.changes(max(0, registry.version - 1))
        applied = registry.store.applied()
        version = registry.version
    latest = f" ({_when(changes[-1].at_ms)}, {changes[-1].author}: {changes[-1].summary})" \
        if changes else ""
    print(f"{registry.path}: version {version}{latest}")
    for consumer, (at_version, at_ms) in sorted(applied.items()):
        behind = "" if at_version == version else f" — {version - at_version} behind"
        print(f"  {consumer}: applies version {at_version} since {_when(at_ms)}{behind}")
    if not applied:
        print("  no running engine has applied a version yet")
    return EXIT_OK


def _when(at_ms: int) -> str:
    return datetime.fromtimestamp(at_ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
