"""The metric operator's aggregates, filters, output rows, late-event corrections, state bytes and
errors, on metrics written in the language and compiled from the parsed declaration."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from cep.events.event import EngineError, StateError
from cep.metrics import (
    MetricCompileError,
    MetricInputError,
    MetricOperator,
    MetricStateError,
    compile_metric,
    metric_match_id,
)
from query_lang import ast, load_program
from query_lang.timestamps import format_iso_ms as iso_utc

STREAM = (
    "stream txn (card_id string, amount float, merchant string, country string, device string,"
    " user_id string, ts timestamp) time ts lateness {lateness}\n"
)
END = 2**62
MINUTE = 60_000


def compiled(metric_text: str, lateness: str = "30s", **options):
    program = load_program(text=STREAM.format(lateness=lateness) + metric_text)
    (metric,) = program.metrics.values()
    return compile_metric(metric, streams=program.streams, **options)


def operator(metric_text: str, lateness: str = "30s", **options) -> MetricOperator:
    return MetricOperator(compiled(metric_text, lateness, **options))


def batch(**columns) -> pd.DataFrame:
    n = len(next(iter(columns.values())))
    return pd.DataFrame({**columns, "_seq": np.arange(n)})


# ---------------------------------------------------------------- exact aggregates


def test_exact_aggregates_ignore_nulls() -> None:
    op = operator(
        "metric m from txn by merchant window tumbling 1m "
        "select count() as n, count(amount) as priced, sum(amount) as total, avg(amount) as mean,"
        " min(amount) as lo, max(amount) as hi, min(country) as first_country"
    )
    df = batch(
        merchant=["m1", "m1", "m1", "m2"],
        amount=[2.5, None, 7.5, None],
        country=["NL", "BE", None, None],
        ts=[1, 2, 3, 4],
    )
    rows = {r["key"]["merchant"]: r["values"] for r in op.process_batch(df, END)}
    assert rows["m1"] == {"n": 3, "priced": 2, "total": 10.0, "mean": 5.0, "lo": 2.5,
                          "hi": 7.5, "first_country": "BE"}
    # No value at all: counts are 0, the others null.
    assert rows["m2"] == {"n": 1, "priced": 0, "total": None, "mean": None, "lo": None,
                          "hi": None, "first_country": None}


def test_select_may_compute_over_aggregates_and_name_group_fields() -> None:
    op = operator(
        "metric m from txn by merchant window tumbling 1m "
        "select merchant, sum(amount) / count() as mean, max(amount) - min(amount) as spread"
    )
    (row,) = op.process_batch(batch(merchant=["x", "x"], amount=[1.0, 4.0], ts=[0, 1]), END)
    assert row["values"] == {"merchant": "x", "mean": 2.5, "spread": 3.0}


def test_null_group_values_form_their_own_group() -> None:
    op = operator("metric m from txn by merchant window tumbling 1m select count() as n")
    rows = op.process_batch(batch(merchant=["x", None, None, "x"], ts=[0, 1, 2, 3]), END)
    assert sorted((r["key"]["merchant"] or "", r["values"]["n"]) for r in rows) == [
        ("", 2), ("x", 2)
    ]


# ---------------------------------------------------------------- sketch-backed aggregates


def test_approx_distinct_is_within_three_standard_errors() -> None:
    op = operator(
        "metric m from txn window tumbling 1h select approx_distinct(card_id) as cards"
    )
    rng = np.random.default_rng(3)
    cards = np.array([f"card-{i}" for i in range(20_000)], dtype=object)
    picks = np.concatenate([cards, rng.choice(cards, 30_000)])  # 20k distinct among 50k
    (row,) = op.process_batch(
        batch(card_id=picks, ts=rng.integers(0, 3_600_000, len(picks))), END
    )
    bound = 3 * 1.04 / np.sqrt(2**14)
    assert abs(row["values"]["cards"] / 20_000 - 1) < bound


@pytest.mark.parametrize("q", [0.01, 0.5, 0.9, 0.99])
def test_approx_percentile_is_within_one_percent_of_rank(q: float) -> None:
    op = operator(
        f"metric m from txn window tumbling 1h select approx_percentile(amount, {q}) as p"
    )
    amounts = np.random.default_rng(5).lognormal(3.0, 1.0, 50_000)
    (row,) = op.process_batch(batch(amount=amounts, ts=np.arange(50_000) * 10), END)
    rank = np.mean(amounts <= row["values"]["p"])
    assert abs(rank - q) <= 0.01


def test_sketches_are_per_window_and_group() -> None:
    op = operator(
        "metric m from txn by merchant window tumbling 1m "
        "select approx_distinct(card_id) as cards, approx_percentile(amount, 1) as top"
    )
    df = batch(
        merchant=["a", "a", "a", "b", "a"],
        card_id=["c1", "c2", "c1", "c1", "c3"],
        amount=[1.0, 2.0, 3.0, 40.0, 50.0],
        ts=[0, 1, 2, 3, MINUTE],
    )
    rows = sorted(op.process_batch(df, END), key=lambda r: (r["start"], r["key"]["merchant"]))
    assert [(r["key"]["merchant"], r["values"]) for r in rows] == [
        ("a", {"cards": 2, "top": 3.0}),
        ("b", {"cards": 1, "top": 40.0}),
        ("a", {"cards": 1, "top": 50.0}),
    ]


# ---------------------------------------------------------------- where, having, seen


def test_where_filters_events_before_aggregation() -> None:
    op = operator(
        'metric m from txn where country != "US" and amount > 1 window tumbling 1m '
        "select count() as n, sum(amount) as total"
    )
    df = batch(country=["NL", "US", "NL", None], amount=[5.0, 100.0, 0.5, 7.0], ts=[0, 1, 2, 3])
    (row,) = op.process_batch(df, END)
    # Comparing null with "US" is false, so the last event is filtered out too.
    assert row["values"] == {"n": 1, "total": 5.0}
    late_rejected = op.late({"country": "US", "amount": 3.0}, 10, END)
    assert late_rejected == []


def test_having_keeps_only_rows_that_pass() -> None:
    op = operator(
        "metric m from txn by merchant window tumbling 1m "
        "select count() as n, approx_distinct(card_id) as cards having cards >= 2 and n < 4"
    )
    df = batch(
        merchant=["one", "two", "two", "many", "many", "many", "many"],
        card_id=["a", "a", "b", "a", "b", "c", "d"],
        ts=[0, 1, 2, 3, 4, 5, 6],
    )
    rows = op.process_batch(df, END)
    assert [(r["key"], r["values"]) for r in rows] == [({"merchant": "two"}, {"n": 2, "cards": 2})]


def test_having_may_read_group_fields() -> None:
    op = operator(
        'metric m from txn by merchant window tumbling 1m select count() as n '
        'having merchant == "b"'
    )
    rows = op.process_batch(batch(merchant=["a", "b"], ts=[0, 1]), END)
    assert [r["key"] for r in rows] == [{"merchant": "b"}]


def test_seen_alerts_on_a_value_new_to_the_group() -> None:
    op = operator(
        "metric new_device from txn by user_id window tumbling 1m "
        "select count() as n, seen(device) as known having not known"
    )
    df = batch(
        user_id=["u1", "u1", "u1", "u1", "u2", "u1"],
        device=["d1", "d1", "d1", None, "d1", "d2"],
        ts=[0, 10, MINUTE, MINUTE + 1, MINUTE + 2, 2 * MINUTE],
    )
    rows = op.process_batch(df, END)
    assert [(r["key"]["user_id"], r["start"]) for r in rows] == [
        ("u1", iso_utc(0)),  # d1 first appears
        ("u2", iso_utc(MINUTE)),  # d1 is new to u2: groups do not share history
        ("u1", iso_utc(2 * MINUTE)),  # d2 first appears
    ]


def test_seen_means_before_the_window_started_even_when_windows_overlap() -> None:
    op = operator(
        "metric m from txn window hopping 2m every 1m select seen(device) as known"
    )
    df = batch(device=["d1", "d1"], ts=[30_000, 90_000])
    rows = {r["start"]: r["values"]["known"] for r in op.process_batch(df, END)}
    assert rows == {
        iso_utc(-MINUTE): False,  # [-1m, 1m): d1 at 30s is its first occurrence
        iso_utc(0): False,  # [0, 2m): d1 first occurred inside the window, not before it
        iso_utc(MINUTE): True,  # [1m, 3m): d1 occurred at 30s, before the window started
    }


def test_seen_history_outlives_the_windows_it_came_from() -> None:
    op = operator("metric m from txn window tumbling 1m select seen(device) as known", "0s")
    day = 24 * 60 * MINUTE
    first = op.process_batch(batch(device=["d"], ts=[0]), day)
    assert [r["values"]["known"] for r in first] == [False]
    assert op.open_windows == 0  # the window is gone, the group's history is not
    later = op.process_batch(batch(device=["d"], ts=[day + 5]), END)
    assert [r["values"]["known"] for r in later] == [True]


# ---------------------------------------------------------------- output rows


def test_output_rows_have_the_documented_shape() -> None:
    op = operator(
        "metric spend from txn by merchant, country window tumbling 1m select count() as n "
        "severity high"
    )
    (row,) = op.process_batch(batch(merchant=["m"], country=["NL"], ts=[61_000]), END)
    window = {"start": "1970-01-01T00:01:00.000Z", "end": "1970-01-01T00:02:00.000Z"}
    assert row == {
        "kind": "metric",
        "name": "spend",
        "version": 1,
        "match_id": metric_match_id("spend", 1, {"merchant": "m", "country": "NL"},
                                    MINUTE, 2 * MINUTE, 0, {"n": 1}),
        "key": {"merchant": "m", "country": "NL"},
        "window": window,
        "values": {"n": 1},
        "final": True,
        "correction": False,
        "revision": 0,
        "severity": "high",
        "start": window["start"],
        "end": window["end"],
    }
    assert re.fullmatch(r"[0-9a-f]{32}", row["match_id"])


def test_replays_give_the_same_match_ids() -> None:
    text = "metric m from txn by merchant window hopping 2m every 1m select count() as n"
    df = batch(merchant=["a", "b", "a"], ts=[0, 30_000, 70_000])
    first = [r["match_id"] for r in operator(text).process_batch(df, END)]
    again = [r["match_id"] for r in operator(text).process_batch(df, END)]
    assert first == again and len(set(first)) == len(first) == 5


def test_a_metric_built_as_a_syntax_tree_compiles_without_the_parser() -> None:
    stream = ast.StreamDecl(
        "txn", (ast.FieldDecl("amount", "float"), ast.FieldDecl("ts", "timestamp")), "ts",
    )
    metric = ast.MetricDecl(
        "big", ("txn",), ast.Window("tumbling", ast.Duration(MINUTE)),
        (ast.EmitItem(ast.Call("sum", (ast.FieldRef("amount"),)), "total"),),
        having=ast.BinOp(">", ast.FieldRef("total"), ast.Literal(10)),
    )
    op = MetricOperator(compile_metric(metric, streams={"txn": stream}))
    rows = op.process_batch(batch(amount=[6.0, 6.0, 1.0], ts=[0, 1, MINUTE]), END)
    assert [r["values"] for r in rows] == [{"total": 12.0}]


# ---------------------------------------------------------------- late events


def test_a_late_event_in_a_retained_window_yields_a_correction() -> None:
    op = operator("metric m from txn by merchant window tumbling 1m select count() as n")
    (final,) = op.process_batch(batch(merchant=["a", "a"], ts=[1_000, 2_000]), MINUTE)
    assert final["values"] == {"n": 2} and final["revision"] == 0

    (fix,) = op.late({"merchant": "a"}, 3_000, 70_000)
    assert fix["values"] == {"n": 3}
    assert fix["correction"] is True and fix["final"] is True and fix["revision"] == 1
    assert fix["match_id"] != final["match_id"]
    assert fix["match_id"] == metric_match_id("m", 1, {"merchant": "a"}, 0, MINUTE, 1, {"n": 3})
    assert (fix["start"], fix["end"]) == (final["start"], final["end"])

    (again,) = op.late({"merchant": "a"}, 4_000, 89_999)
    assert again["revision"] == 2 and again["values"] == {"n": 4}
    # Retention ends one lateness (30s) after the window's end.
    assert op.late({"merchant": "a"}, 5_000, 90_000) is None
    assert op.advance_watermark(90_000) == []
    assert op.late({"merchant": "a"}, 5_000, 90_000) is None


def test_a_late_event_that_changes_no_result_yields_no_correction() -> None:
    op = operator("metric m from txn window tumbling 1m select max(amount) as hi")
    op.process_batch(batch(amount=[9.0], ts=[0]), MINUTE)
    assert op.late({"amount": 1.0}, 5, MINUTE) == []
    (fix,) = op.late({"amount": 10.0}, 6, MINUTE)
    assert fix["values"] == {"hi": 10.0} and fix["revision"] == 1


def test_a_late_event_in_a_window_never_reported_yields_its_first_result() -> None:
    op = operator("metric m from txn by merchant window tumbling 1m select count() as n")
    op.process_batch(batch(merchant=["a"], ts=[0]), MINUTE)
    (row,) = op.late({"merchant": "b"}, 10, MINUTE + 5_000)
    assert row["key"] == {"merchant": "b"} and row["revision"] == 0
    assert row["correction"] is False


def test_a_late_event_older_than_the_operator_watermark_is_counted_on_time() -> None:
    op = operator("metric m from txn window tumbling 1m select count() as n")
    op.process_batch(batch(ts=[0]), 10)
    # The engine's watermark is ahead, but this operator has not closed the window yet.
    assert op.late({}, 20, MINUTE) == []
    assert [r["values"] for r in op.advance_watermark(MINUTE)] == [{"n": 2}]


def test_late_corrections_under_having_and_for_sliding_windows() -> None:
    op = operator(
        "metric m from txn window sliding 10s select count() as n having n >= 2", "10s"
    )
    # Windows (-9s, 1s] and (-5s, 5s] close at watermark 6s; only the second has n >= 2.
    rows = op.process_batch(batch(ts=[1_000, 5_000]), 6_000)
    assert [(r["end"], r["values"]["n"]) for r in rows] == [(iso_utc(5_000), 2)]
    fixes = op.late({}, 2_000, 7_000)
    # (-5s, 5s] is corrected; the late event's own (-8s, 2s] holds 1_000 and 2_000 and so
    # passes having with its first result.
    assert sorted((r["end"], r["values"]["n"], r["revision"]) for r in fixes) == [
        (iso_utc(2_000), 2, 0), (iso_utc(5_000), 3, 1),
    ]
    op2 = operator("metric m from txn window sliding 10s select count() as n", "10s")
    rows = op2.process_batch(batch(ts=[1_000, 5_000]), 6_000)
    assert [r["values"]["n"] for r in rows] == [1, 2]
    fixes = op2.late({}, 3_000, 7_000)
    # The late event falls in the window of t=5000 (a correction) and opens its own (-7s, 3s].
    assert sorted((r["end"], r["values"]["n"], r["revision"]) for r in fixes) == [
        (iso_utc(3_000), 2, 0), (iso_utc(5_000), 3, 1),
    ]
    assert op2.late({}, 1_000 - 5_000, 20_000) is None


def test_a_late_event_that_bridges_two_reported_sessions_corrects_them_as_one() -> None:
    op = operator("metric m from txn window session gap 10s select count() as n", "30s")
    rows = op.process_batch(batch(ts=[0, 15_000]), 30_000)
    assert sorted((r["start"], r["end"]) for r in rows) == [
        (iso_utc(0), iso_utc(10_000)), (iso_utc(15_000), iso_utc(25_000)),
    ]
    (fix,) = op.late({}, 8_000, 30_000)
    assert (fix["start"], fix["end"], fix["values"]) == (iso_utc(0), iso_utc(25_000), {"n": 3})
    assert fix["correction"] is True and fix["revision"] == 1
    assert op.late({}, 8_000, 45_000) is None  # older than the watermark minus one lateness


def test_seen_is_corrected_for_later_windows_when_an_earlier_value_arrives_late() -> None:
    op = operator(
        "metric m from txn window tumbling 1m select seen(device) as known", "2m"
    )
    rows = op.process_batch(batch(device=["x", "y"], ts=[0, MINUTE]), 2 * MINUTE)
    assert [r["values"]["known"] for r in rows] == [False, False]
    (fix,) = op.late({"device": "y"}, 1_000, 2 * MINUTE)
    # y now occurred in [0, 1m) before the window [1m, 2m) started; [0, 1m) still has new x.
    assert fix["start"] == iso_utc(MINUTE) and fix["values"] == {"known": True}


# ---------------------------------------------------------------- state bytes


def test_state_bytes_round_trip_keeps_sketches_and_history() -> None:
    text = (
        "metric m from txn by merchant window tumbling 1m select approx_distinct(card_id) as c,"
        " approx_percentile(amount, 0.5) as p, seen(card_id) as known, min(country) as lo"
    )
    op = operator(text)
    df = batch(merchant=["a", "a", "b"], card_id=["x", "y", "x"], amount=[1.0, 3.0, 2.0],
               country=["NL", None, "BE"], ts=[0, 1, 2])
    op.process_batch(df, 10)
    data = op.to_bytes()
    assert data[:4] == b"VGMO"
    restored = MetricOperator.from_bytes(op.compiled, data)
    assert restored.to_bytes() == data
    assert restored.advance_watermark(END) == op.advance_watermark(END)


def test_state_bytes_are_checked() -> None:
    op = operator("metric m from txn window tumbling 1m select count() as n")
    op.process_batch(batch(ts=[0]), 1)
    data = op.to_bytes()
    with pytest.raises(MetricStateError, match="truncated or corrupted"):
        MetricOperator.from_bytes(op.compiled, data[:-1])
    with pytest.raises(MetricStateError, match="truncated or corrupted"):
        MetricOperator.from_bytes(op.compiled, data[:10] + b"\xff" + data[11:])
    other = compiled("metric m from txn window tumbling 2m select count() as n")
    with pytest.raises(MetricStateError, match="another definition"):
        MetricOperator.from_bytes(other, data)
    assert issubclass(MetricStateError, StateError)


# ---------------------------------------------------------------- errors


def test_bad_batches_are_reported_with_the_metric_name() -> None:
    op = operator("metric spend from txn window tumbling 1m select count() as n")
    with pytest.raises(MetricInputError, match="metric 'spend'.*no 'ts' column"):
        op.process_batch(pd.DataFrame({"amount": [1.0]}), 0)
    with pytest.raises(MetricInputError, match="without a time"):
        op.process_batch(pd.DataFrame({"ts": [1.0, None]}), 0)
    op.process_batch(batch(ts=[MINUTE]), MINUTE)
    with pytest.raises(MetricInputError, match="older than the watermark.*late\\(\\)"):
        op.process_batch(batch(ts=[5]), MINUTE)
    with pytest.raises(MetricInputError):
        op.process({}, 5)
    assert issubclass(MetricInputError, EngineError) and issubclass(MetricInputError, ValueError)


def test_datetime_time_columns_are_read_as_epoch_milliseconds() -> None:
    op = operator("metric m from txn window tumbling 1m select count() as n")
    ts = pd.to_datetime([0, 59_999, 60_000], unit="ms", utc=True)
    rows = op.process_batch(pd.DataFrame({"ts": ts}), END)
    assert [(r["start"], r["values"]["n"]) for r in rows] == [
        (iso_utc(0), 2), (iso_utc(MINUTE), 1)
    ]


def test_compile_errors_name_the_metric_and_the_place() -> None:
    stream = ast.StreamDecl(
        "txn", (ast.FieldDecl("amount", "float"), ast.FieldDecl("tags", "list<string>")), "ts"
    )
    at = ast.Span("rules.vigil", 3, 7)

    def metric(**changes) -> ast.MetricDecl:
        base = ast.MetricDecl(
            "m", ("txn",), ast.Window("tumbling", ast.Duration(MINUTE)),
            (ast.EmitItem(ast.Call("count"), "n"),), span=ast.Span("rules.vigil", 1, 1),
        )
        return ast.MetricDecl(**{**base.__dict__, **changes})

    declaration = ast.Span("rules.vigil", 1, 1)
    with pytest.raises(MetricCompileError) as error:
        compile_metric(metric(streams=("pay",)), streams={"txn": stream})
    assert (error.value.message, error.value.span) == (
        "metric 'm': reads undeclared stream 'pay'", declaration
    )
    bad_q = ast.Call("approx_percentile", (ast.FieldRef("amount"), ast.Literal(99, span=at)))
    with pytest.raises(MetricCompileError, match=r"^rules.vigil:3:7: metric 'm'.*from 0 to 1"):
        compile_metric(metric(select=(ast.EmitItem(bad_q, "p"),)), streams={"txn": stream})
    with pytest.raises(MetricCompileError, match="cannot group by 'tags'") as error:
        compile_metric(metric(by=("tags",)), streams={"txn": stream})
    assert error.value.span == declaration
    with pytest.raises(MetricCompileError, match="longer than zero"):
        compile_metric(metric(window=ast.Window("tumbling", ast.Duration(0))),
                       streams={"txn": stream})
    unknown = ast.InList(ast.FieldRef("amount"), "nope", span=at)
    with pytest.raises(MetricCompileError, match="^rules.vigil:3:7: metric 'm': ") as error:
        compile_metric(metric(where=unknown), streams={"txn": stream})
    assert error.value.span == at and error.value.message.startswith("metric 'm': ")


def test_the_worked_example_of_the_documentation() -> None:
    op = operator(
        "metric m from txn by merchant window tumbling 1m "
        "select count() as n, sum(amount) as total having n >= 2"
    )
    s = 1_000
    df = batch(merchant=["a", "a", "b"], amount=[5.0, 7.0, 1.0], ts=[10 * s, 20 * s, 30 * s])
    assert op.process_batch(df, 40 * s) == []
    (row,) = op.advance_watermark(60 * s)
    assert (row["key"], row["values"], row["revision"]) == ({"merchant": "a"},
                                                            {"n": 2, "total": 12.0}, 0)
    (fix,) = op.late({"merchant": "b", "amount": 2.0}, 45 * s, 70 * s)
    assert (fix["key"], fix["values"]) == ({"merchant": "b"}, {"n": 2, "total": 3.0})
    assert fix["correction"] is True and fix["revision"] == 1
    assert op.late({"merchant": "a", "amount": 1.0}, 50 * s, 90 * s) is None


def test_rows_of_one_call_come_by_window_end_then_start_then_key() -> None:
    op = operator("metric m from txn by merchant window hopping 2m every 1m select count() as n")
    df = batch(merchant=["b", "a", "c", "a"], ts=[0, 1, MINUTE + 1, MINUTE + 2])
    rows = op.process_batch(df, END)
    order = [(r["end"], r["start"], r["key"]["merchant"]) for r in rows]
    assert order == sorted(order) and len(rows) == 7


def test_values_of_the_wrong_kind_never_fail_a_metric() -> None:
    stream = ast.StreamDecl("raw", (ast.FieldDecl("v", "string"),), None)
    items = tuple(
        ast.EmitItem(ast.Call(func, (ast.FieldRef("v"),)), func)
        for func in ("min", "max", "sum", "avg", "approx_distinct")
    )
    metric = ast.MetricDecl("m", ("raw",), ast.Window("tumbling", ast.Duration(MINUTE)), items)
    op = MetricOperator(compile_metric(metric, streams={"raw": stream}))
    mixed = np.array([1, "a", 2.5, True, None], dtype=object)
    (row,) = op.process_batch(pd.DataFrame({"v": mixed, "ts": [0, 1, 2, 3, 4]}), END)
    # min/max over a number and a string is null; sums skip what is not a number; the
    # sketches hash True like 1 (equal in Python), so 3 distinct values.
    assert row["values"] == {"min": None, "max": None, "sum": 3.5, "avg": 1.75,
                             "approx_distinct": 3}


def test_a_metric_over_two_streams_reads_fields_of_both() -> None:
    text = (
        "stream orders (id string, amount float, ts timestamp) time ts\n"
        "stream refunds (id string, refund float, ts timestamp) time ts\n"
        "metric flow from orders, refunds window tumbling 1m "
        "select count(amount) as orders, count(refund) as refunds, sum(refund) as refunded"
    )
    program = load_program(text=text)
    op = MetricOperator(compile_metric(program.metrics["flow"], streams=program.streams))
    df = pd.DataFrame({"id": ["o1", "o2", "o1"], "amount": [10.0, 20.0, None],
                       "refund": [None, None, 10.0], "ts": [0, 1, 2]})
    (row,) = op.process_batch(df, END)
    assert row["values"] == {"orders": 2, "refunds": 1, "refunded": 10.0}


@pytest.mark.parametrize("distinct", [3, 256, 257, 700])
def test_approx_distinct_equals_one_sketch_over_the_window_however_batched(
    distinct: int,
) -> None:
    from sketches import HyperLogLog

    text = "metric m from txn window tumbling 1h select approx_distinct(card_id) as cards"
    cards = np.array([f"card-{i % distinct}" for i in range(2 * distinct)], dtype=object)
    expected = round(HyperLogLog(14).update(cards).estimate())
    whole = operator(text).process_batch(batch(card_id=cards, ts=np.arange(len(cards))), END)
    split = operator(text)
    half = len(cards) // 2
    split.process_batch(batch(card_id=cards[:half], ts=np.arange(half)), None)
    restored = MetricOperator.from_bytes(split.compiled, split.to_bytes())
    rest = batch(card_id=cards[half:], ts=np.arange(half, len(cards)))
    assert [r["values"]["cards"] for r in whole] == [expected]
    assert [r["values"]["cards"] for r in restored.process_batch(rest, END)] == [expected]


def test_a_window_with_few_values_does_not_hold_a_whole_hyperloglog() -> None:
    op = operator("metric m from txn by merchant window hopping 10m every 1m "
                  "select approx_distinct(card_id) as cards")
    op.process_batch(batch(merchant=["a", "a"], card_id=["x", "y"], ts=[0, 1]), 0)
    assert op.open_windows == 10
    assert len(op.to_bytes()) < 4096  # ten 16 KiB sketches would be 160 KiB


def test_seen_history_moves_to_the_bloom_filter_when_a_group_has_many_values() -> None:
    op = operator("metric m from txn window tumbling 1m select seen(device) as known", "0s")
    devices = np.array([f"dev-{i}" for i in range(20_000)], dtype=object)
    first = op.process_batch(batch(device=devices, ts=np.arange(20_000) % MINUTE), 3 * MINUTE)
    assert [r["values"]["known"] for r in first] == [False]
    state_size = len(op.to_bytes())
    assert state_size > 170_000  # 20k values is past the exact set: a 176 KiB Bloom filter
    restored = MetricOperator.from_bytes(op.compiled, op.to_bytes())
    for runner in (op, restored):
        rows = runner.process_batch(
            batch(device=["dev-5", "dev-19999", "new"], ts=[3 * MINUTE, 4 * MINUTE, 5 * MINUTE]),
            END,
        )
        assert [r["values"]["known"] for r in rows] == [True, True, False]
