"""``vigil alerts``: the durable webhook outbox from the command line (status, replay, drain,
log)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from datetime import UTC, datetime

from cep.alerts import AlertConfigError, Dispatcher, Outbox, OutboxError, replay, status
from cep.alerts.routing import DEFAULT_OUTBOX, endpoints_from_program
from cep.cli.arguments import EXIT_ERRORS, UsageError, expand_rule_paths
from query_lang import check_program
from query_lang.timestamps import parse_iso_ms


def configure_parser(sub) -> None:
    parser = sub.add_parser("alerts", help="inspect and deliver the webhook outbox")
    actions = parser.add_subparsers(dest="alerts_command", metavar="ACTION")
    actions.required = True

    st = actions.add_parser("status", help="pending, delivered and failed alerts per endpoint")
    st.add_argument("--outbox", default=DEFAULT_OUTBOX)
    st.set_defaults(handler=_cmd_status)

    rp = actions.add_parser("replay", help="deliver alerts again (same webhook-id)")
    rp.add_argument("--since", required=True, help="ISO-8601 time, e.g. 2026-11-21T00:00Z")
    rp.add_argument("--endpoint", help="only this webhook")
    rp.add_argument("--outbox", default=DEFAULT_OUTBOX)
    rp.set_defaults(handler=_cmd_replay)

    dr = actions.add_parser("drain", help="deliver what is due, until done or the deadline")
    dr.add_argument("files", nargs="+", help="rule files declaring the webhooks")
    dr.add_argument("--outbox", default=DEFAULT_OUTBOX)
    dr.add_argument("--deadline", type=float, default=30.0, help="seconds (default 30)")
    dr.set_defaults(handler=_cmd_drain)

    lg = actions.add_parser("log", help="delivery attempts, newest last")
    lg.add_argument("--outbox", default=DEFAULT_OUTBOX)
    lg.add_argument("--endpoint")
    lg.add_argument("--limit", type=int, default=50)
    lg.set_defaults(handler=_cmd_log)


def _open_existing(path: str) -> Outbox:
    if not os.path.exists(path):
        raise UsageError(f"no outbox at {path} (vigil run writes one; see --outbox)")
    try:
        return Outbox(path)
    except OutboxError as err:
        raise UsageError(f"{err} (see --outbox)") from None


def _require_endpoint(outbox: Outbox, name: str | None) -> None:
    """A usage error unless ``name`` (``--endpoint``) is an endpoint of the outbox."""
    if name is None:
        return
    known = sorted(status(outbox))
    if name not in known:
        listed = f"known: {', '.join(known)}" if known else "it has no endpoints yet"
        raise UsageError(f"--endpoint {name!r}: no such endpoint in {outbox.path} ({listed})")


def _cmd_status(args: argparse.Namespace) -> int:
    with _open_existing(args.outbox) as outbox:
        rows = status(outbox)
    print(f"{'endpoint':<16} {'pending':>8} {'delivered':>10} {'failed':>7} {'disabled':>9} "
          f"{'conflicts':>9}  url")
    for name, s in sorted(rows.items()):
        flag = " (endpoint disabled)" if s.endpoint_disabled else ""
        print(f"{name:<16} {s.pending:>8} {s.delivered:>10} {s.failed:>7} {s.disabled:>9} "
              f"{s.conflicts:>9}  {s.url}{flag}")
    if not rows:
        print("(the outbox is empty)")
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    since_ms = parse_iso_ms(args.since)
    if since_ms is None:
        raise UsageError(f"--since {args.since!r} is not an ISO-8601 time")
    since = datetime.fromtimestamp(since_ms / 1000, tz=UTC)
    with _open_existing(args.outbox) as outbox:
        _require_endpoint(outbox, args.endpoint)
        count = replay(outbox, since, args.endpoint)
    print(f"queued {count} alert(s) for delivery again")
    return 0


def _cmd_drain(args: argparse.Namespace) -> int:

    program, errors = check_program(expand_rule_paths(args.files))
    for err in errors:
        print(err.render(), file=sys.stderr)
    if errors:
        return EXIT_ERRORS
    try:
        endpoints = endpoints_from_program(program)
    except AlertConfigError as err:
        print(f"vigil: {err}", file=sys.stderr)
        return EXIT_ERRORS
    with _open_existing(args.outbox) as outbox:
        result = Dispatcher(outbox, list(endpoints.values())).drain(args.deadline)
    print(f"delivered {result.delivered}, retried {result.retried}, failed {result.failed}, "
          f"pending {result.pending}")
    if result.unknown_endpoints:
        # Not an error: a drain may cover some rule files only. Said, so none waits unexplained.
        print(f"kept pending for {', '.join(result.unknown_endpoints)}: no webhook of that name "
              f"in the rule files given")
    return 0


def _cmd_log(args: argparse.Namespace) -> int:
    with _open_existing(args.outbox) as outbox:
        _require_endpoint(outbox, args.endpoint)
        attempts = outbox.attempts(endpoint=args.endpoint)
    for a in attempts[-args.limit:]:
        print(json.dumps(dataclasses.asdict(a), default=str))
    return 0
