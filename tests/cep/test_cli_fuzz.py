"""Random command lines built from ``vigil``'s real sub-commands and options, with odd values
(missing paths, directories, ``/dev/null``, negative and huge numbers, empty and unicode text):
``vigil`` answers each with a documented exit code and never a traceback.

Spark is never started: ``run`` always gets ``--engine embedded``, and ``demo`` and ``sample``
(which start servers or write many files) are left out. ``VIGIL_FUZZ_EXAMPLES`` raises the
number of examples.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from unittest import mock

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cep.cli.arguments import EXIT_ERRORS, EXIT_OK, EXIT_USAGE
from cep.cli.main import main

RULES = """
stream txn (card string, amount float, body string, ts timestamp) time ts
rule r from txn by card pattern small big within 1h
  define small as amount < 1, big as amount > 100
query q from txn match body:hello
metric m from txn by card window tumbling 1m select count() as n
"""
EVENTS = [
    {"card": "c", "amount": 0.5, "body": "hello", "ts": "2026-01-01T00:00:00Z"},
    {"card": "c", "amount": 500.0, "body": "x", "ts": "2026-01-01T00:00:10Z"},
]


@pytest.fixture(scope="module")
def place(tmp_path_factory):
    """A directory with a good, a bad and a deeply nested rule file, events, and a folder."""
    root = tmp_path_factory.mktemp("cli_fuzz")
    (root / "good.vigil").write_text(RULES)
    (root / "bad.vigil").write_text(RULES.replace("amount < 1", "amout < 1") + "rule\n")
    (root / "deep.vigil").write_text(RULES + "query d from txn match " + "(" * 5000 + "x\n")
    (root / "latin1.vigil").write_bytes("stream s (caf\xe9 string)\n".encode("latin-1"))
    (root / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in EVENTS))
    (root / "folder").mkdir()
    (root / "folder" / "good.vigil").write_text(RULES)
    return root


NUMBERS = ["-1", "0", "1", "3", "1e309", "nan", "-inf", "9" * 40, "", "abc", "\u0663", " 2"]
NAMES = ["r", "q", "m", "nope", "", "\u00e9t\u00e9", "--rule", "txn", "-"]
PATHS = [
    "good.vigil", "bad.vigil", "deep.vigil", "latin1.vigil", "events.jsonl", "folder",
    "folder/*.vigil", "/dev/null", "/nonexistent/file.vigil", "", "\u00e9\u00e9.vigil", ".",
    "missing.vigil",
]
OUTPUTS = [
    "-", "out.jsonl", "folder", "/dev/null", "/nonexistent/dir/out.jsonl", "", "\u00e9.jsonl",
]
DOCUMENTS = [
    "{}", '{"body": "hello", "ts": "2026-01-01T00:00:00Z"}', "[]", "null", "{", "@events.jsonl",
    "@/nonexistent", "@folder", "@/dev/null", "", '{"ts": 1e400}', "@", "@latin1.vigil",
]
TIMES = ["2026-01-01T00:00:00Z", "yesterday", "", "9999-99-99", "-1", "\u00e9"]


def _pairs(draw, options: dict[str, list[str] | None]) -> list[str]:
    """A few of ``options``, each with a value from its list (None: a flag)."""
    argv: list[str] = []
    for name in draw(st.lists(st.sampled_from(sorted(options)), max_size=4)):
        values = options[name]
        argv.append(name)
        if values is not None:
            argv.append(draw(st.sampled_from(values)))
    return argv


@st.composite
def command_lines(draw) -> list[str]:
    command = draw(st.sampled_from(["check", "format", "explain", "run", "alerts", "junk"]))
    files = draw(st.lists(st.sampled_from(PATHS), min_size=0, max_size=3))
    if command == "check":
        argv = ["check", *files, *_pairs(draw, {"-q": None, "--quiet": None})]
    elif command == "format":
        argv = ["format", *files]
    elif command == "explain":
        argv = ["explain", *files[:1], *_pairs(draw, {
            "--rule": NAMES, "--query": NAMES, "--document": DOCUMENTS, "--stream": NAMES,
            "--format": ["text", "dot", "svg", ""],
        })]
    elif command == "run":
        argv = ["run", *files, "--engine", "embedded", "--events",
                draw(st.sampled_from(["events.jsonl", *PATHS, "txn=events.jsonl", "nope=x",
                                      "-"])),
                *_pairs(draw, {
                    "--out": OUTPUTS, "--dead-letter": OUTPUTS, "--max-partials": NUMBERS,
                    "--progress": None, "--outbox": ["outbox.db", *PATHS],
                    "--delivery-deadline": NUMBERS, "--buckets": NUMBERS,
                    "--checkpoint": OUTPUTS, "--events": PATHS,
                })]
    elif command == "alerts":
        action = draw(st.sampled_from(["status", "replay", "drain", "log", "bogus"]))
        argv = ["alerts", action, *_pairs(draw, {
            "--outbox": ["outbox.db", *PATHS], "--since": TIMES, "--endpoint": NAMES,
            "--deadline": ["0", "-1", "nan", "", "0.01"], "--limit": NUMBERS,
        })]
    else:
        argv = draw(st.lists(st.text(max_size=8), max_size=4))
    if draw(st.integers(0, 9)) == 0:  # now and then a stray token anywhere
        argv.insert(draw(st.integers(0, len(argv))), draw(st.sampled_from(
            ["--help", "-h", "--", "--nope", "", "\u00e9", *NUMBERS[:3]]
        )))
    return argv


@settings(
    max_examples=int(os.environ.get("VIGIL_FUZZ_EXAMPLES", 60)),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(argv=command_lines())
def test_any_command_line_ends_with_an_exit_code_never_a_traceback(place, argv) -> None:
    out, err = io.StringIO(), io.StringIO()
    with (
        contextlib.chdir(place),
        mock.patch.object(sys, "stdin", io.StringIO(json.dumps(EVENTS[0]) + "\n")),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
    ):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse's --help, or a command that exits itself
            code = exit_.code or 0
    assert code in (EXIT_OK, EXIT_ERRORS, EXIT_USAGE), (argv, code, err.getvalue()[-2000:])
    assert "Traceback" not in err.getvalue(), (argv, err.getvalue()[-2000:])
    event(f"{argv[0] if argv else ''} -> {code}")
