"""Tables through the command line: ``vigil run`` (embedded) with its dead letters and
summary, ``vigil format`` and ``vigil explain`` of a program with a table, and the Spark
operator's refusal naming the table."""

from __future__ import annotations

import json

from cep.cli import main

PROGRAM = """\
stream card_changes (card_id string, home string, op string, ts timestamp) time ts lateness 1m
stream txn (card_id string, country string, ts timestamp) time ts lateness 1m
table cards from card_changes key card_id op op upsert "c", "u" delete "d" retain 5m
rule abroad from txn by card_id
  pattern a
  define a as country != lookup(cards, card_id).home
  emit card_id, lookup(cards, card_id).home as home
"""

ROWS = [
    {"stream": "card_changes", "card_id": "c1", "home": "FR", "op": "c", "ts": 10},
    {"stream": "txn", "card_id": "c1", "country": "DE", "ts": 20},
    {"stream": "card_changes", "card_id": "c1", "home": "DE", "op": "truncate", "ts": 25},
    {"stream": "card_changes", "home": "DE", "op": "u", "ts": 26},
    {"stream": "card_changes", "card_id": "c1", "home": "DE", "op": "u", "ts": 30},
    {"stream": "txn", "card_id": "c1", "country": "DE", "ts": 40},
]


def _write(tmp_path):
    rules = tmp_path / "cards.vigil"
    rules.write_text(PROGRAM)
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return rules, events


def test_run_embedded_reads_the_table_and_letters_the_rows_that_change_nothing(tmp_path, capsys):
    rules, events = _write(tmp_path)
    out, dead = tmp_path / "matches.jsonl", tmp_path / "dead.jsonl"
    code = main(["run", str(rules), "--events", str(events), "--engine", "embedded",
                 "--out", str(out), "--dead-letter", str(dead), "--no-alerts"])
    assert code == 0
    matches = [json.loads(line) for line in out.read_text().splitlines()]
    assert [m["values"] for m in matches] == [{"card_id": "c1", "home": "FR"}]
    letters = [json.loads(line) for line in dead.read_text().splitlines()]
    assert [(d["reason"], d["line"]) for d in letters] == [("unknown_op", 3), ("missing_key", 4)]
    assert letters[0]["detail"].startswith("table cards: op 'truncate' is neither an upsert")
    err = capsys.readouterr().err
    assert "2 changelog row(s) that changed no table" in err
    assert "table cards: 1 key(s)" in err


def test_format_prints_the_table_back_and_explain_compiles_the_rule(tmp_path, capsys):
    rules, _ = _write(tmp_path)
    assert main(["format", str(rules)]) == 0
    printed = capsys.readouterr().out
    assert 'table cards from card_changes key card_id op op upsert "c", "u" delete "d" retain 5m' \
        in printed
    assert "lookup(cards, card_id).home as home" in printed
    assert main(["explain", str(rules), "--rule", "abroad"]) == 0
    assert "rule abroad" in capsys.readouterr().out
    assert main(["check", str(rules)]) == 0
    assert capsys.readouterr().out.strip().endswith("2 stream(s), 1 table(s)")


def test_check_names_a_misused_lookup_with_its_place(tmp_path, capsys):
    rules = tmp_path / "bad.vigil"
    rules.write_text(
        PROGRAM.replace("lookup(cards, card_id).home as", "lookup(card, card_id).home as")
    )
    assert main(["check", str(rules)]) == 1
    err = capsys.readouterr().err
    assert f"{rules}:7:17" in err and "unknown table 'card' (tables: cards)" in err
