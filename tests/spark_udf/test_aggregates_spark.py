"""Sketch aggregates on a real local Spark: partial sketches per partition merged on reduce give
exactly the embedded HyperLogLog, t-digest quantiles within their error bound, and the same
answers as the embedded metric operator."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pyspark.sql import functions as F

from cep.metrics.operator import MetricOperator, compile_metric
from query_lang import load_program
from query_lang.timestamps import format_iso_ms as iso_utc
from sketches import HyperLogLog, TDigest, from_bytes
from spark_udf.aggregates import approx_distinct, approx_percentile, sketch_agg
from spark_udf.errors import OperatorConfigError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def events() -> pd.DataFrame:
    rng = np.random.default_rng(11)
    n = 30_000
    merchant = rng.choice(np.array(["m1", "m2", "m3", None], dtype=object), n, p=[.5, .3, .15, .05])
    return pd.DataFrame({
        "merchant": merchant,
        "card_id": np.array([f"card-{i}" for i in rng.integers(0, 12_000, n)], dtype=object),
        "amount": rng.lognormal(3.0, 1.0, n),
        "ts": rng.integers(0, 3 * 60_000, n),
    })


def spark_frame(spark, pdf: pd.DataFrame, partitions: int = 5):
    schema = "merchant string, card_id string, amount double, ts long"
    return spark.createDataFrame(pdf, schema=schema).repartition(partitions)


def test_distinct_counts_equal_one_sketch_over_all_data(spark, events: pd.DataFrame) -> None:
    df = spark_frame(spark, events)
    assert df.rdd.getNumPartitions() == 5
    result = sketch_agg(
        df, ["merchant"], {"cards": ("hll", "card_id"), "p99": ("tdigest", "amount", 0.99)},
        keep_sketches=True,
    ).toPandas()
    assert len(result) == 4  # m1, m2, m3 and the null merchant
    for row in result.itertuples(index=False):
        mine = events[events["merchant"].isna()] if row.merchant is None else \
            events[events["merchant"] == row.merchant]
        whole = HyperLogLog(14).update(mine["card_id"].to_numpy())
        assert bytes(row.cards_sketch) == whole.to_bytes()  # registers merge exactly
        assert row.cards == round(whole.estimate())
        exact = mine["card_id"].nunique()
        assert abs(row.cards / exact - 1) < 3 * 1.04 / np.sqrt(2**14)
        amounts = mine["amount"].to_numpy()
        assert abs(np.mean(amounts <= row.p99) - 0.99) <= 0.01
        single = TDigest(100).update(amounts).quantile(0.99)
        assert abs(row.p99 / single - 1) < 0.02
        merged = from_bytes(bytes(row.p99_sketch))
        assert merged.count == len(amounts) and merged.min == amounts.min()


def test_convenience_functions_and_an_overall_row(spark, events: pd.DataFrame) -> None:
    df = spark_frame(spark, events, partitions=3)
    (overall,) = approx_distinct(df, [], "card_id", name="cards").collect()
    assert overall["cards"] == round(HyperLogLog(14).update(events["card_id"].to_numpy())
                                     .estimate())
    rows = approx_percentile(df, ["merchant"], "amount", 0.5, keep_sketch=True).collect()
    for row in rows:
        if row["merchant"] is None:
            continue
        amounts = events.loc[events["merchant"] == row["merchant"], "amount"].to_numpy()
        assert abs(np.mean(amounts <= row["approx_percentile"]) - 0.5) <= 0.01
        assert from_bytes(bytes(row["approx_percentile_sketch"])).count == len(amounts)


def test_spark_agrees_with_the_embedded_metric_operator(spark, events: pd.DataFrame) -> None:
    text = (
        "stream txn (merchant string, card_id string, amount float, ts timestamp) time ts\n"
        "metric per_minute from txn by merchant window tumbling 1m\n"
        "  select approx_distinct(card_id) as cards"
    )
    program = load_program(text=text)
    op = MetricOperator(compile_metric(program.metrics["per_minute"], streams=program.streams))
    embedded = {
        (r["key"]["merchant"], r["start"]): r["values"]["cards"]
        for r in op.process_batch(events.assign(_seq=np.arange(len(events))), 2**62)
    }
    df = spark_frame(spark, events).withColumn(
        "minute", (F.floor(F.col("ts") / 60_000) * 60_000).cast("long")
    )
    spark_rows = sketch_agg(df, ["merchant", "minute"], {"cards": ("hll", "card_id")}).collect()
    assert {(r["merchant"], iso_utc(r["minute"])): r["cards"] for r in spark_rows} == embedded


def test_malformed_specs_are_rejected_by_name(spark, events: pd.DataFrame) -> None:
    df = spark_frame(spark, events.head(10), partitions=1)
    with pytest.raises(OperatorConfigError, match="sketch 'p99'.*needs a quantile"):
        sketch_agg(df, ["merchant"], {"p99": ("tdigest", "amount")})
    with pytest.raises(OperatorConfigError, match="unknown kind 'cms'"):
        sketch_agg(df, ["merchant"], {"x": ("cms", "amount")})
    with pytest.raises(OperatorConfigError, match="column 'nope' is not in the DataFrame"):
        sketch_agg(df, ["merchant"], {"x": ("hll", "nope")})
