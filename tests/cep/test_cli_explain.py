"""`vigil explain`: a rule's compiled automaton as text and as Graphviz DOT that renders; why a
query matches a document or not."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from cep.cli import main
from cep.engine.engine import Engine


def test_explain_text(capsys):
    assert main(["explain", "examples/fraud.vigil", "--rule", "card_testing"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("rule card_testing (version 1): contiguity relaxed")
    assert "TAKE probe" in out and "TAKE big" in out and "ACCEPT" in out


def test_explain_dot_renders(capsys, tmp_path, unavailable):
    assert main(["explain", "examples/trading.vigil", "--rule", "v_shape", "--format", "dot"]) == 0
    dot = capsys.readouterr().out
    assert dot.startswith('digraph "v_shape" {') and dot.rstrip().endswith("}")
    if shutil.which("dot") is None:
        unavailable("Graphviz 'dot' is not installed; the DOT text was checked above")
    svg = subprocess.run(["dot", "-Tsvg"], input=dot, capture_output=True, text=True, check=True)
    assert "<svg" in svg.stdout


def test_explain_unknown_rule_is_a_usage_error(capsys):
    assert main(["explain", "examples/trading.vigil", "--rule", "nope"]) == 2
    assert "rules: v_shape" in capsys.readouterr().err


ARTICLE = {"id": "d1", "title": "ACME Corp cuts jobs", "body": "layoffs loom", "source": "wire",
           "views": 2000, "ts": "2026-11-25T10:00:00Z"}


def _explain_query(*extra: str, document: dict | str = ARTICLE, query: str = "acme_news"):
    text = document if isinstance(document, str) else json.dumps(document)
    return main(["explain", "examples/news.vigil", "--query", query, "--document", text, *extra])


def test_explain_query_match_with_the_engines_highlights(capsys):
    assert _explain_query() == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith('MATCH: ((title:"acme corp" OR title:acme) AND')
    assert "    [match]    views >= 1000 — views = 2000 is within the range" in out
    # The same highlights the engine writes for this event.
    engine = Engine()
    engine.register("examples/news.vigil")
    engine.feed(ARTICLE, "news")
    engine.close()
    [row] = [r for r in engine.drain() if r.get("name") == "acme_news"]
    assert out[-1] == "highlights: " + json.dumps(row["highlights"], separators=(",", ":"))


def test_explain_query_no_match_names_each_failing_clause(capsys, tmp_path):
    calm = {**ARTICLE, "body": "all calm", "source": "tabloid", "views": 20}
    path = tmp_path / "doc.json"
    path.write_text(json.dumps(calm), encoding="utf-8")
    assert _explain_query(document=f"@{path}") == 0
    out = capsys.readouterr().out
    assert out.startswith("NO MATCH:") and "highlights" not in out
    assert "[no match] NOT — the clause matches, so this fails" in out
    assert "views = 20 is not within the range" in out


def test_explain_query_reads_the_document_as_an_event_of_its_stream(capsys):
    assert _explain_query(document={**ARTICLE, "views": "lots"}) == 1
    err = capsys.readouterr().err
    assert "not a valid 'news' event" in err and "field 'views' expected int" in err
    assert _explain_query(document="{not json") == 1
    assert "invalid_json: not valid JSON" in capsys.readouterr().err
    assert _explain_query(document="[1]") == 1
    assert "expected a JSON object" in capsys.readouterr().err
    # read as the engines read an event line: the same limits and dead-letter reasons
    assert _explain_query(document='{"views": 1e400}') == 1
    assert "non_finite: field 'views'" in capsys.readouterr().err
    assert _explain_query(document="[" * 100_000) == 1
    assert "too_deep" in capsys.readouterr().err


@pytest.mark.parametrize(("argv", "message"), [
    (["--query", "nope", "--document", "{}"], "queries: acme_news, breach_watch"),
    (["--query", "acme_news"], "--query needs --document"),
    (["--query", "acme_news", "--document", "{}", "--format", "dot"], "--format dot is for rules"),
    (["--rule", "x", "--document", "{}"], "--document and --stream go with --query"),
    (["--query", "acme_news", "--document", "{}", "--stream", "txn"], "does not read stream 'txn'"),
    (["--query", "acme_news", "--document", "@/no/such/file.json"], "cannot read the document"),
])
def test_explain_query_usage_errors(capsys, argv, message):
    assert main(["explain", "examples/news.vigil", *argv]) == 2
    assert message in capsys.readouterr().err


def test_explain_query_of_several_streams_needs_the_stream(capsys, tmp_path):
    rules = tmp_path / "two.vigil"
    rules.write_text(
        "stream a (id string, title text, ts timestamp) time ts\n"
        "stream b (id string, title text, ts timestamp) time ts\n"
        'query both "either stream"\n  from a, b\n  match title:acme\n',
        encoding="utf-8",
    )
    doc = json.dumps({"id": "1", "title": "Acme", "ts": 0})
    assert main(["explain", str(rules), "--query", "both", "--document", doc]) == 2
    assert "reads a, b: name the document's with --stream" in capsys.readouterr().err
    assert main(["explain", str(rules), "--query", "both", "--document", doc,
                 "--stream", "b"]) == 0
    assert capsys.readouterr().out.endswith('highlights: {"title":[[0,4]]}\n')
