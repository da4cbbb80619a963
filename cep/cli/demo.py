"""``vigil demo``: the whole pipeline on this machine — example rules over the bundled sample
events, matches to ``out/``, and alerts to a webhook receiver started on loopback that
verifies every signature and prints each alert as it arrives.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import sys
import threading
from urllib.parse import urlsplit, urlunsplit

from cep.alerts import WebhookReceiver, new_secret
from cep.cli import run
from cep.cli.arguments import expand_rule_paths
from query_lang import check_program

EXAMPLES = "examples"
SAMPLE_EVENTS = os.path.join("examples", "events")
DEMO_PORT = 8787  # the port the example webhooks point at


def configure_parser(sub) -> None:
    parser = sub.add_parser(
        "demo", help="run the example rules over the sample events and deliver their alerts"
    )
    parser.add_argument("--engine", choices=("spark", "embedded"), default="spark",
                        help="spark (default, local[*] streaming) or embedded")
    parser.add_argument("--rules", default=EXAMPLES, help="rule files (default examples/)")
    parser.add_argument("--events", default=SAMPLE_EVENTS,
                        help="events directory (default examples/events)")
    parser.add_argument("--out", default="out", help="output directory (default out/)")
    parser.add_argument("--port", type=int, default=None,
                        help="port of the local webhook receiver (default 8787, or a free "
                        "one when 8787 is busy; 0 for any free one); the rules' webhooks on "
                        "127.0.0.1:8787 are pointed at it")
    parser.add_argument("--quiet", action="store_true", help="do not print each alert")
    parser.set_defaults(handler=_cmd_demo)


def _cmd_demo(args: argparse.Namespace) -> int:

    paths = expand_rule_paths([args.rules])
    program, errors = check_program(paths)
    for err in errors:
        print(err.render(), file=sys.stderr)
    if errors:
        return 1
    # One fresh secret per webhook; the receiver knows them all, the engine reads them from
    # the environment exactly as in production.
    secrets = []
    for decl in program.webhooks.values():
        for secret in decl.secrets:
            if secret.env:
                os.environ[secret.env] = os.environ.get(secret.env) or new_secret()
                secrets.append(os.environ[secret.env])
    # A fresh out/ each run, so the receiver (new each run) gets every alert once.
    shutil.rmtree(args.out, ignore_errors=True)
    os.makedirs(args.out)

    lock = threading.Lock()
    received: collections.Counter[str] = collections.Counter()

    def on_alert(alert) -> None:
        data = alert.data or {}
        with lock:
            received[data.get("name", "?")] += 1
        if not args.quiet:
            what = data.get("key") or {"document": data.get("document_id")}
            shown = ", ".join(f"{k}={v}" for k, v in what.items())
            line = f"  alert  {data.get('severity', ''):<8} {data.get('name', ''):<22} {shown}\n"
            with lock:
                sys.stderr.write(line)
                sys.stderr.flush()

    try:
        receiver = _start_receiver(tuple(dict.fromkeys(secrets)), on_alert, args.port)
    except OSError as err:
        print(f"vigil demo: cannot listen on 127.0.0.1:{args.port} ({err.strerror}); "
              "choose another --port", file=sys.stderr)
        return 2
    try:
        print(f"webhook receiver listening on {receiver.url}", file=sys.stderr)
        moved = _moved_webhooks(program, receiver.url)
        if moved:
            print(f"the webhooks {', '.join(sorted(moved))} (declared on 127.0.0.1:{DEMO_PORT}) "
                  f"send to {receiver.url} instead", file=sys.stderr)
        matches_out = os.path.join(
            args.out, "matches" if args.engine == "spark" else "matches.jsonl"
        )

        # Parsed by `vigil run`'s own parser, so every option it has gets its default.
        run_parser = run.configure_parser(argparse.ArgumentParser(prog="vigil").add_subparsers())
        run_args = run_parser.parse_args([
            *paths, "--events", args.events, "--engine", args.engine, "--out", matches_out,
            "--dead-letter", os.path.join(
                args.out, "dead_letters" if args.engine == "spark" else "dead_letters.jsonl"
            ),
            "--progress", "--outbox", os.path.join(args.out, "outbox.sqlite"),
            "--delivery-deadline", "30", "--master", "local[*]",
            "--checkpoint", os.path.join(args.out, "checkpoint"),
            *(f"--webhook-url={name}={url}" for name, url in sorted(moved.items())),
        ])
        code = run.run(run_args)
    finally:
        receiver.stop()
    _summary_table(matches_out, received, receiver.rejected)
    return code


def _start_receiver(secrets: tuple[str, ...], on_alert, port: int | None) -> WebhookReceiver:
    """The receiver on ``port``; without one, on 8787 or, when that is busy, a free port.

    Raises
    ------
    OSError
        When the port asked for cannot be listened on.
    """
    try:
        return WebhookReceiver(secrets, on_alert=on_alert,
                               port=DEMO_PORT if port is None else port).start()
    except OSError as err:
        if port is not None:
            raise
        print(f"vigil demo: port {DEMO_PORT} is busy ({err.strerror}); the receiver takes a "
              "free one", file=sys.stderr)
        return WebhookReceiver(secrets, on_alert=on_alert, port=0).start()


def _moved_webhooks(program, receiver_url: str) -> dict[str, str]:
    """Webhook name -> its URL on the receiver, for each webhook declared on
    127.0.0.1:8787 when the receiver listens elsewhere."""
    receiver = urlsplit(receiver_url)
    if receiver.port == DEMO_PORT:
        return {}
    moved = {}
    for name, decl in program.webhooks.items():
        declared = urlsplit(decl.url)
        if (declared.hostname, declared.port) == ("127.0.0.1", DEMO_PORT):
            moved[name] = urlunsplit(declared._replace(netloc=receiver.netloc))
    return moved


def _summary_table(path: str, received, rejected: int) -> None:
    import glob
    import json

    counts: collections.Counter[tuple[str, str]] = collections.Counter()
    # the embedded engine writes one file; Spark one file per micro-batch
    files = sorted(glob.glob(os.path.join(path, "*.jsonl"))) if os.path.isdir(path) else [path]
    for name in files:
        if not os.path.exists(name):
            continue
        with open(name, encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    match = json.loads(line)
                    counts[(match["kind"], match["name"])] += 1
    print("\n  kind    name                    matches  alerts received", file=sys.stderr)
    for (kind, name), n in sorted(counts.items()):
        print(f"  {kind:<7} {name:<23} {n:>7}  {received.get(name, 0):>15}", file=sys.stderr)
    print(f"\n  {sum(counts.values())} matches in {path}; {sum(received.values())} alerts "
          f"received and verified, {rejected} rejected", file=sys.stderr)
