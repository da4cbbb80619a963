"""Between the engine and webhook delivery: which matches alert whom, throttling, the durable
outbox, and the ``vigil alerts`` sub-commands (status, replay, drain, log).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime

from cep.alerts import (
    AlertConfigError,
    Dispatcher,
    DrainResult,
    Endpoint,
    Outbox,
    Throttle,
    replay,
    status,
)
from query_lang import Program, ast

DEFAULT_OUTBOX = os.path.join("out", "outbox.sqlite")


def endpoints_from_program(
    program: Program, env: Mapping[str, str] | None = None
) -> dict[str, Endpoint]:
    """One :class:`Endpoint` per ``webhook`` declaration, with secrets read from ``env``.

    Raises
    ------
    AlertConfigError
        Naming the webhook and the environment variable when a secret is missing.
    """
    env = os.environ if env is None else env
    endpoints: dict[str, Endpoint] = {}
    for name, decl in program.webhooks.items():
        secrets = []
        for secret in decl.secrets:
            if secret.env is not None:
                value = env.get(secret.env)
                if not value:
                    raise AlertConfigError(
                        f"webhook '{name}' ({_where(decl)}) reads its secret from "
                        f"${secret.env}, which is not set"
                    )
                secrets.append(value)
            elif secret.value is not None:
                secrets.append(secret.value)
        if not secrets:
            raise AlertConfigError(
                f"webhook '{name}' ({_where(decl)}) has no secret; add: secret env VARIABLE"
            )
        endpoints[name] = Endpoint(name, decl.url, tuple(secrets))
    return endpoints


def _where(decl: ast.Node) -> str:
    return f"{decl.span.file}:{decl.span.line}"


def _time_ms(text: str | None) -> int:
    if not text:
        return 0
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


@dataclass
class AlertSink:
    """Takes every match; enqueues those whose rule, query or metric has ``notify``.

    A match is written to the outbox (durably) before :meth:`submit` returns, so an engine
    that acknowledges input after ``submit`` never loses an alert. ``throttle D`` lets one
    alert per (name, key) through per interval of event time; the rest are counted.
    """

    program: Program
    outbox: Outbox
    endpoints: dict[str, Endpoint]
    throttles: dict[str, Throttle] = field(default_factory=dict)
    enqueued: int = 0
    throttled: int = 0

    @classmethod
    def open(
        cls, program: Program, outbox_path: str, env: Mapping[str, str] | None = None
    ) -> AlertSink:
        endpoints = endpoints_from_program(program, env)
        directory = os.path.dirname(outbox_path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        sink = cls(program, Outbox(outbox_path), endpoints)
        for decl in _standing(program).values():
            if decl.throttle is not None:
                sink.throttles[decl.name] = Throttle(decl.throttle.ms)
        return sink

    def submit(self, match: dict) -> bool:
        """Enqueue ``match`` for its declaration's webhooks; False when nobody is notified or
        the throttle held it back."""
        decl = _standing(self.program).get(match.get("name", ""))
        if decl is None or not decl.notify:
            return False
        throttle = self.throttles.get(decl.name)
        if throttle is not None:
            key = json.dumps(match.get("key", {}), sort_keys=True, default=str)
            if not throttle.allow(decl.name, key, _time_ms(match.get("end"))):
                self.throttled += 1
                return False
        targets = [self.endpoints[n] for n in decl.notify if n in self.endpoints]
        self.enqueued += self.outbox.enqueue(match, targets)
        return True

    def drain(self, deadline_s: float) -> DrainResult:
        return Dispatcher(self.outbox, list(self.endpoints.values())).drain(deadline_s)

    def close(self) -> None:
        self.outbox.close()


def _standing(program: Program) -> dict[str, ast.Node]:
    return {**program.rules, **program.queries, **program.metrics}


# --------------------------------------------------------------------------- CLI


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
    from cep.cli import UsageError

    if not os.path.exists(path):
        raise UsageError(f"no outbox at {path} (vigil run writes one; see --outbox)")
    return Outbox(path)


def _cmd_status(args: argparse.Namespace) -> int:
    with _open_existing(args.outbox) as outbox:
        rows = status(outbox)
    print(f"{'endpoint':<16} {'pending':>8} {'delivered':>10} {'failed':>7} {'disabled':>9}  url")
    for name, s in sorted(rows.items()):
        flag = " (endpoint disabled)" if s.endpoint_disabled else ""
        print(f"{name:<16} {s.pending:>8} {s.delivered:>10} {s.failed:>7} {s.disabled:>9}  "
              f"{s.url}{flag}")
    if not rows:
        print("(the outbox is empty)")
    return 0


def _cmd_replay(args: argparse.Namespace) -> int:
    from cep.cli import UsageError

    try:
        since = datetime.fromisoformat(args.since.replace("Z", "+00:00"))
    except ValueError:
        raise UsageError(f"--since {args.since!r} is not an ISO-8601 time") from None
    if since.tzinfo is None:
        since = since.replace(tzinfo=UTC)
    with _open_existing(args.outbox) as outbox:
        count = replay(outbox, since, args.endpoint)
    print(f"queued {count} alert(s) for delivery again")
    return 0


def _cmd_drain(args: argparse.Namespace) -> int:
    from cep.cli import EXIT_ERRORS, expand_rule_paths
    from query_lang import check_program

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
    return 0


def _cmd_log(args: argparse.Namespace) -> int:
    with _open_existing(args.outbox) as outbox:
        attempts = outbox.attempts(endpoint=args.endpoint)
    for a in attempts[-args.limit:]:
        print(json.dumps(dataclasses.asdict(a), default=str))
    return 0
