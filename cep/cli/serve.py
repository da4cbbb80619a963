"""``vigil serve``: the registry, the embedded engine and its matches over HTTP
(:mod:`cep.service`), and ``vigil serve token create|revoke|list`` for its API tokens.

The service binds 127.0.0.1 unless ``--host`` says otherwise; TLS is uvicorn's
(``--ssl-certfile``, ``--ssl-keyfile``). Its state — tokens, match log, outbox, the engine's
checkpoint — lives in ``--state DIR`` (default ``.vigil/serve``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from datetime import UTC, datetime

from cep.cli.arguments import EXIT_ERRORS, EXIT_OK, UsageError
from cep.cli.registry import default_registry
from cep.registry import RegistryError
from cep.service import Scope, Service, ServiceConfig, ServiceError, TokenError, TokenStore
from cep.service.service import MAX_BODY
from cep.service.spark_job import SparkJob

DEFAULT_STATE = os.path.join(".vigil", "serve")


def configure_parser(sub) -> None:
    parser = sub.add_parser(
        "serve", help="run the registry, the engine and its matches as an HTTP service",
        description="Serve the registry of standing queries and the embedded engine over "
        "HTTP (docs/service.md). `vigil serve token ...` manages its API tokens.",
    )
    parser.add_argument("--registry", default=None, metavar="PATH",
                        help="the registry file (default $VIGIL_REGISTRY or "
                        ".vigil/registry.sqlite)")
    parser.add_argument("--state", default=DEFAULT_STATE, metavar="DIR",
                        help=f"tokens, match log, outbox, checkpoint (default {DEFAULT_STATE})")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to bind (default 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, default=8080, help="default 8080")
    parser.add_argument("--ssl-certfile", metavar="PEM", help="serve HTTPS with this "
                        "certificate (uvicorn's option)")
    parser.add_argument("--ssl-keyfile", metavar="PEM", help="its private key")
    parser.add_argument("--max-body", type=int, default=MAX_BODY, metavar="BYTES",
                        help=f"largest request body (default {MAX_BODY:,}; 413 beyond)")
    parser.add_argument("--rate", type=float, default=100.0, metavar="N",
                        help="requests per second per token (default 100; 0: no limit)")
    parser.add_argument("--burst", type=int, default=200, metavar="N",
                        help="requests a token may make at once (default 200)")
    parser.add_argument("--checkpoint-interval", type=float, default=30.0, metavar="SECONDS",
                        help="save the engine's state this often (default 30)")
    parser.add_argument("--log-level", default="info",
                        choices=["critical", "error", "warning", "info", "debug"])
    spark = parser.add_argument_group(
        "next to a Spark job",
        "serve only the API beside `vigil run --registry PATH --follow --engine spark "
        "--events redis://... --out DIR`: no engine in this process; posted events go to the "
        "job's Redis stream, the job's committed micro-batches come to the match log, the "
        "registry version in effect is the one its micro-batches run",
    )
    spark.add_argument("--spark-out", metavar="DIR",
                       help="the Spark job's --out directory")
    spark.add_argument("--events-to", metavar="redis://HOST:PORT[/DB]/KEY",
                       help="the job's --events stream, where POST /events appends")
    spark.add_argument("--spark-checkpoint", metavar="DIR",
                       help="the job's --checkpoint (default DIR/_checkpoint)")
    spark.add_argument("--spark-dead-letter", metavar="DIR",
                       help="the job's --dead-letter directory, to show its dead letters")
    spark.add_argument("--spark-outbox", metavar="PATH",
                       help="the job's --outbox (default DIR/_outbox.sqlite)")
    parser.set_defaults(handler=_cmd_serve)

    actions = parser.add_subparsers(dest="serve_command", metavar="token")
    token = actions.add_parser("token", help="API tokens: create, revoke, list")
    token_actions = token.add_subparsers(dest="token_command", metavar="ACTION")
    token_actions.required = True

    def action(name: str, help_text: str, handler) -> argparse.ArgumentParser:
        p = token_actions.add_parser(name, help=help_text)
        # SUPPRESS: a value given before `token` is not overwritten by this default.
        p.add_argument("--state", default=argparse.SUPPRESS, metavar="DIR",
                       help=f"the service's state directory (default {DEFAULT_STATE})")
        p.set_defaults(handler=handler)
        return p

    create = action("create", "create a token and print it (once)", _cmd_token_create)
    create.add_argument("name", help="who uses it: the author of the changes it makes")
    create.add_argument("--scope", choices=[s.value for s in Scope], default="read",
                        help="read: GETs and /check; write: also changes and events "
                        "(default read)")
    revoke = action("revoke", "revoke a token", _cmd_token_revoke)
    revoke.add_argument("name")
    action("list", "the tokens (names, scopes, when created or revoked)", _cmd_token_list)


def _cmd_serve(args: argparse.Namespace) -> int:
    import uvicorn  # only the server needs it (and the web framework)

    from cep.service import create_app

    if args.ssl_keyfile and not args.ssl_certfile:
        raise UsageError("--ssl-keyfile needs --ssl-certfile")
    job = None
    if args.spark_out or args.events_to:
        if not (args.spark_out and args.events_to):
            raise UsageError("--spark-out and --events-to go together: the Spark job's --out "
                             "directory and its --events stream")
        job = SparkJob(args.events_to, args.spark_out, checkpoint=args.spark_checkpoint,
                       dead_letter=args.spark_dead_letter, outbox=args.spark_outbox)
    elif args.spark_checkpoint or args.spark_dead_letter or args.spark_outbox:
        raise UsageError("--spark-checkpoint, --spark-dead-letter and --spark-outbox need "
                         "--spark-out and --events-to")
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(message)s")
    config = ServiceConfig(
        registry=args.registry or default_registry(),
        state_dir=args.state,
        max_body=args.max_body,
        rate=args.rate,
        burst=args.burst,
        checkpoint_interval_s=args.checkpoint_interval,
        spark_job=job,
    )
    try:
        service = Service(config)
    except (ServiceError, RegistryError) as err:
        raise UsageError(str(err)) from None
    if not service.tokens.list():
        print(f"vigil serve: no API token yet; create one: vigil serve token create NAME "
              f"--scope write --state {args.state}", file=sys.stderr)
    scheme = "https" if args.ssl_certfile else "http"
    print(f"vigil serve: {scheme}://{args.host}:{args.port} — registry {config.registry}, "
          f"state {config.state_dir}", file=sys.stderr)
    if job is not None:
        print(f"vigil serve: next to the Spark job writing {job.out}: events go to its "
              "stream, its committed micro-batches to the match log", file=sys.stderr)
    uvicorn.run(
        create_app(service),
        host=args.host,
        port=args.port,
        ssl_certfile=args.ssl_certfile,
        ssl_keyfile=args.ssl_keyfile,
        log_level=args.log_level,
        timeout_graceful_shutdown=3,  # open event streams end then
    )
    return EXIT_OK


def _tokens(args: argparse.Namespace) -> TokenStore:
    return TokenStore(getattr(args, "state", None) or DEFAULT_STATE)


def _cmd_token_create(args: argparse.Namespace) -> int:
    store = _tokens(args)
    try:
        token = store.create(args.name, args.scope)
    except TokenError as err:
        print(f"vigil serve token: {err}", file=sys.stderr)
        return EXIT_ERRORS
    finally:
        store.close()
    print(token)
    print(f"vigil serve token: '{args.name}' ({args.scope}) — shown this once; it is stored "
          "hashed", file=sys.stderr)
    return EXIT_OK


def _cmd_token_revoke(args: argparse.Namespace) -> int:
    store = _tokens(args)
    try:
        store.revoke(args.name)
    except TokenError as err:
        print(f"vigil serve token: {err}", file=sys.stderr)
        return EXIT_ERRORS
    finally:
        store.close()
    print(f"revoked '{args.name}'")
    return EXIT_OK


def _cmd_token_list(args: argparse.Namespace) -> int:
    store = _tokens(args)
    try:
        tokens = store.list()
    finally:
        store.close()
    print(f"{'name':<24} {'scope':<6} {'created':<20} revoked")
    for t in tokens:
        revoked = _when(t.revoked_ms) if t.revoked_ms is not None else "-"
        print(f"{t.name:<24} {t.scope.value:<6} {_when(t.created_ms):<20} {revoked}")
    return EXIT_OK


def _when(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
