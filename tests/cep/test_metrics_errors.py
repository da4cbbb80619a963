"""Metric compile errors are language errors: a ``VigilError`` with the span of the offending
code, rendered with its location by the library and by ``vigil run``."""

from __future__ import annotations

import dataclasses

import pytest

from cep.cli import main
from cep.errors import EngineError
from cep.metrics import MetricCompileError, MetricError, compile_metric
from query_lang import VigilError, ast, parse

RULES = (
    "stream txn (card string, tags list<string>, amount float, ts timestamp) time ts\n"
    "metric spend from txn by {by} window tumbling 1m select sum(amount) as total\n"
)


def declarations(by: str = "card", path: str = "rules.vigil"):
    stream, metric = parse(RULES.format(by=by), path).declarations
    return stream, metric


def test_a_compile_error_is_a_located_language_and_engine_error() -> None:
    assert issubclass(MetricCompileError, VigilError)
    assert issubclass(MetricCompileError, MetricError)
    assert issubclass(MetricCompileError, EngineError)
    assert issubclass(MetricCompileError, ValueError)
    stream, metric = declarations(by="tags")
    with pytest.raises(MetricCompileError) as caught:
        compile_metric(metric, streams={"txn": stream})
    error = caught.value
    message = "metric 'spend': cannot group by 'tags', a list<string> field; group by single values"
    assert error.message == message  # the location is carried, not pasted into the message
    assert (error.file, error.line, error.column) == ("rules.vigil", 2, 1)
    assert str(error) == f"rules.vigil:2:1: {message}"
    assert error.render() == f"rules.vigil:2:1: error: {message}"
    source = RULES.format(by="tags")
    shown = MetricCompileError(error.message, error.span, source).render().splitlines()
    assert shown[1:] == ["  " + source.splitlines()[1], "  ^"]


def test_the_error_points_at_the_offending_token_when_it_has_a_place() -> None:
    stream, metric = declarations()
    where = parse(
        "stream txn (card string, tags list<string>, amount float, ts timestamp) time ts\n"
        "metric spend from txn where amount in nope window tumbling 1m select count() as n\n",
        "rules.vigil",
    ).declarations[1].where
    with pytest.raises(MetricCompileError) as caught:
        compile_metric(dataclasses.replace(metric, where=where), streams={"txn": stream})
    assert (caught.value.line, caught.value.column) == (2, where.span.column)
    assert caught.value.message.startswith("metric 'spend': ")


def test_an_error_without_a_position_is_the_bare_message() -> None:
    stream, metric = declarations(by="tags")
    unplaced = dataclasses.replace(metric, span=ast.NO_SPAN)
    with pytest.raises(MetricCompileError) as caught:
        compile_metric(unplaced, streams={"txn": stream})
    assert caught.value.span is None
    assert str(caught.value) == caught.value.message


def test_vigil_run_reports_a_metric_that_cannot_compile_with_its_location(
    tmp_path, capsys
) -> None:
    rules = tmp_path / "bad.vigil"
    rules.write_text(RULES.format(by="tags"))
    events = tmp_path / "e.jsonl"
    events.write_text("")
    assert main(["run", str(rules), "--events", str(events)]) == 1
    err = capsys.readouterr().err
    # The checks that `run` starts with see it (as `vigil check` does), at the field's name.
    assert f"{rules}:2:26: error: metric 'spend': cannot group by 'tags'" in err


def test_vigil_check_reports_a_malformed_metric_with_its_location(tmp_path, capsys) -> None:
    rules = tmp_path / "bad.vigil"
    rules.write_text(RULES.format(by="card").replace("sum(amount)", "approx_percentile(amount, 2)"))
    assert main(["check", str(rules)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(f"{rules}:2:")
    assert "from 0 to 1" in err[0] and err[2].strip() == "^"
