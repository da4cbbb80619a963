"""The complete example of the language specification parses, round-trips and checks."""

from __future__ import annotations

from pathlib import Path

from query_lang import ast, check_program, parse, print_module

FIXTURES = Path(__file__).parent.parent / "fixtures"
SPEC_FILE = (FIXTURES / "language_complete.vigil").read_text(encoding="utf-8")

# The specification's example uses streams and a webhook it does not declare.
PRELUDE = """
stream orders (order_id string, status string, amount float, ts timestamp) time ts
stream payments (order_id string, amount float, ts timestamp) time ts
stream ticks (symbol string, price float, ts timestamp) time ts
stream logins (user_id string, lat float, lon float, ts timestamp) time ts
stream news (id string, title text, body text, source string, views int, ts timestamp) time ts
webhook media_team url "https://hooks.example.com/media" secret env MEDIA_SECRET
"""


def test_spec_example_parses_and_round_trips():
    module = parse(SPEC_FILE, "spec.vigil")
    kinds = [type(d).__name__ for d in module.declarations]
    assert kinds.count("RuleDecl") == 5
    assert kinds.count("QueryDecl") == 1 and kinds.count("MetricDecl") == 1
    printed = print_module(module)
    assert parse(printed) == module
    # the comments are printed back, in order, and printing is canonical
    assert [c.text for c in parse(printed).comments] == [c.text for c in module.comments]
    assert len(module.comments) == 4
    assert print_module(parse(printed)) == printed


def test_spec_example_checks_clean_with_its_missing_declarations(tmp_path):
    (tmp_path / "common.vigil").write_text(PRELUDE)
    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "stolen_cards.txt").write_text("4000\n")
    path = tmp_path / "spec.vigil"
    path.write_text(SPEC_FILE)
    program, errors = check_program([str(path)])
    assert [e.render() for e in errors] == []
    rule = program.rules["card_testing"]
    assert rule.pattern == ast.PatSeq(
        (ast.PatQuant(ast.PatVar("probe"), 3, None, True), ast.PatVar("big"))
    )
    assert rule.within == ast.Duration(600_000)
    assert program.rules["unpaid_order"].defines[1] == ast.Define("paid", stream="payments")
    assert program.metrics["merchant_velocity"].window == ast.Window(
        "sliding", ast.Duration(600_000), ast.Duration(60_000)
    )


def test_spec_example_without_prelude_names_what_is_missing(tmp_path):
    path = tmp_path / "spec.vigil"
    path.write_text(SPEC_FILE.replace('include "common.vigil"', ""))
    _, errors = check_program([str(path)])
    missing = sorted({e.message for e in errors if "undeclared stream" in e.message})
    assert missing == [
        "undeclared stream 'logins'",
        "undeclared stream 'news'",
        "undeclared stream 'orders'",
        "undeclared stream 'payments'",
        "undeclared stream 'ticks'",
    ]
