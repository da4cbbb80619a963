"""A Vigil program over a DataFrame of events: its rules and metrics in the keyed operator and its
queries in the stateless pass, unioned into one output frame. ``run_spark`` builds its query
with :func:`program_outputs`; :func:`detect` does it for a user's own frame in one call."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BinaryType, StringType

from query_lang import ast
from spark_udf import operator
from spark_udf.errors import OperatorConfigError
from spark_udf.operator import detect_plan
from spark_udf.queries import query_names, query_outputs
from spark_udf.records import COUNT_KINDS
from spark_udf.routing import DEFAULT_BUCKETS, RoutePlan
from spark_udf.rules import ProcessorSpec, detect_specs, processor_specs

__all__ = ["AUTO", "ProgramOutputs", "detect", "event_column", "program_outputs"]

AUTO = "auto"
"""``json_col=AUTO``: find the events' column from the frame's schema (:func:`event_column`)."""

_SEQ = "_seq"
_JSON_EVENTS = "_vigil_event"


@dataclass(frozen=True)
class ProgramOutputs:
    """What :func:`program_outputs` built.

    Attributes
    ----------
    outputs:
        The output frame (``spark_udf.OUTPUT_SCHEMA``), or ``None`` when the program declares
        nothing Spark runs.
    inputs:
        The distinct frames the plan reads (Spark keeps an offset for each).
    skipped:
        Declarations the plan does not run.
    """

    outputs: DataFrame | None
    inputs: tuple[DataFrame, ...]
    skipped: tuple[str, ...]


def program_outputs(
    events: DataFrame,
    program: Any,
    specs: Sequence[ProcessorSpec],
    skipped: Sequence[str],
    *,
    json_col: str | None,
    stream: str | None = None,
    buckets: int = DEFAULT_BUCKETS,
    routed: tuple[DataFrame, RoutePlan] | None = None,
    live: Any = None,
) -> ProgramOutputs:
    """The rules and metrics (``specs``) of ``program`` in one keyed operator and its queries
    in one stateless pass (:func:`spark_udf.query_outputs`, with the dead letters of the rows
    no keyed operator checks), over ``events``.

    ``routed`` is a frame that already routes its rows by the plan given with it (the
    ``vigil_jsonl`` source's ``route`` option): the keyed operator reads it instead of routing
    ``events``. ``program`` given as processor specs only runs them (no queries). With
    ``json_col=None`` the events are typed columns: the queries read them as JSON
    (``to_json`` of every column but ``_seq``). With ``live`` (a
    :class:`spark_udf.live.LiveProgram`; ``routed`` by a source given it too) each micro-batch
    runs the program pinned to it, and the query pass reads every row whatever the program.
    """
    inputs: list[DataFrame] = []
    outputs = None
    if routed is not None and specs:
        inputs.append(routed[0])
        outputs = detect_plan(routed[0], routed[1], live)
    elif specs:
        inputs.append(events)
        outputs = detect_specs(events, specs, json_col=json_col, stream=stream, buckets=buckets)
    left = list(skipped)
    if not _only_specs(program):
        # Queries, and the dead letters of rows no keyed operator checks (undeclared streams,
        # streams only queries read), from one stateless pass.
        checked = {name for spec in specs for name in spec.key_cols}
        searched, column = events, json_col
        if json_col is None:
            fields = [F.col(name) for name in events.columns if name != _SEQ]
            searched = events.withColumn(_JSON_EVENTS, F.to_json(F.struct(*fields)))
            column = _JSON_EVENTS
        queries = query_outputs(
            searched, program, json_col=column, stream=stream, operator_streams=checked,
            live=live,
        )
        if queries is not None:
            outputs = queries if outputs is None else outputs.unionByName(queries)
            inputs.append(events)
            run_here = set(query_names(program))  # once: the condition is read per name
            left = [name for name in left if name not in run_here]
    distinct = {id(frame): frame for frame in inputs}
    return ProgramOutputs(outputs, tuple(distinct.values()), tuple(left))


def _only_specs(program: Any) -> bool:
    if isinstance(program, ProcessorSpec):
        return True
    return (
        isinstance(program, Sequence) and not isinstance(program, str) and bool(program)
        and all(isinstance(p, ProcessorSpec) for p in program)
    )


def event_column(df: DataFrame, specs: Sequence[ProcessorSpec]) -> str | None:
    """The column of ``df`` holding each event as JSON text, or ``None`` when the events are
    typed columns: those of every key and time field the ``specs`` read. A frame of one text
    (or binary: Kafka's ``value``) column besides ``_seq`` and ``stream`` is JSON; so is a
    column named ``_event`` (the Vigil sources').

    Raises
    ------
    OperatorConfigError
        When neither fits: the message names the missing fields and the text columns.

    Examples
    --------
    >>> specs, _ = processor_specs('''
    ... stream txn (card_id string, amount float, ts timestamp) time ts
    ... rule big from txn by card_id pattern b define b as amount > 100
    ... ''')
    >>> event_column(spark.createDataFrame([], "key binary, value binary, offset long"), specs)
    Traceback (most recent call last):
    ...
    spark_udf.errors.OperatorConfigError: ...
    >>> event_column(spark.createDataFrame([], "value string, offset long"), specs)
    'value'
    >>> event_column(spark.createDataFrame([], "card_id string, amount double, ts timestamp"),
    ...              specs) is None
    True
    """
    types = {field.name: field.dataType for field in df.schema.fields}
    if isinstance(types.get("_event"), StringType):
        return "_event"
    needed = {field for spec in specs for cols in spec.key_cols.values() for field in cols}
    needed |= {field for spec in specs for field in spec.time_cols.values()}
    if specs and needed <= set(types):
        return None
    texts = [name for name, kind in types.items()
             if isinstance(kind, StringType | BinaryType) and name not in (_SEQ, "stream")]
    if len(texts) == 1:
        return texts[0]
    missing = ", ".join(sorted(needed - set(types))) or "-"
    raise OperatorConfigError(
        f"cannot tell how the frame holds its events: it lacks the program's key and time "
        f"fields ({missing}) for typed columns, and has {len(texts)} text columns "
        f"({', '.join(texts) or 'none'}) where one JSON column was looked for; pass json_col="
    )


def detect(df: DataFrame, program: Any, *args: Any, **kwargs: Any) -> DataFrame:
    """The output frame (``spark_udf.OUTPUT_SCHEMA``) of a Vigil program, or of one keyed
    processor, over a DataFrame of events, streaming or static.

    ``detect(df, program, *, json_col="auto", stream=None, buckets=16, lateness_ms=None)``:
    ``program`` is a rule file path, DSL text or loaded modules (``query_lang.load_program``);
    its rules, metrics and queries all run, as in ``vigil run``. The events are typed columns
    (the fields the rules read, ``_seq`` optional) or a JSON text column, found from the
    frame's schema (:func:`event_column`) unless ``json_col`` names it (a binary column, as
    Kafka's ``value``, is read as UTF-8). ``stream`` binds every row to one stream (default:
    a ``stream`` field, else the program's only stream).

    ``detect(df, processor, *, key_cols, time_col, lateness, ...)`` with a
    :class:`~cep.events.keyed.KeyedProcessor` runs that processor alone
    (:func:`spark_udf.operator.detect`).

    Examples
    --------
    A program's rule and query over a frame of JSON text (``spark`` is a SparkSession):

    >>> events = spark.createDataFrame([
    ...     (0, '{"card_id": "c1", "amount": 500, "merchant": "acme", "ts": 1767225600}'),
    ...     (1, '{"card_id": "c2", "amount": 5, "merchant": "other", "ts": 1767225601}'),
    ... ], "_seq long, value string")
    >>> program = '''
    ... stream txn (card_id string, amount float, merchant text, ts timestamp) time ts
    ... rule big from txn by card_id pattern b define b as amount > 100
    ... query acme from txn match merchant:acme
    ... '''
    >>> sorted((row.kind, row.name, row.key) for row in detect(events, program).collect())
    [('query', 'acme', '{"document_id": "0"}'), ('rule', 'big', '{"card_id":"c1"}')]

    The same events as typed columns:

    >>> typed = spark.createDataFrame([
    ...     ("c1", 500.0, "acme", 1767225600), ("c2", 5.0, "other", 1767225601),
    ... ], "card_id string, amount double, merchant string, ts long")
    >>> sorted((row.kind, row.name) for row in detect(typed, program).collect())
    [('query', 'acme'), ('rule', 'big')]
    """
    if not _is_program(program):
        return operator.detect(df, program, *args, **kwargs).where(
            ~F.col("kind").isin(*COUNT_KINDS)
        )
    if args:
        raise OperatorConfigError("detect(df, program) takes its options by name")
    return _detect_program(df, program, **kwargs)


def _is_program(program: Any) -> bool:
    if isinstance(program, str | os.PathLike | ast.Module | ProcessorSpec):
        return True
    return isinstance(program, Sequence) and bool(program) and all(
        isinstance(p, ast.Module | ProcessorSpec) for p in program
    )


def _detect_program(
    df: DataFrame,
    program: Any,
    *,
    json_col: str | None = AUTO,
    stream: str | None = None,
    buckets: int = DEFAULT_BUCKETS,
    lateness_ms: int | None = None,
) -> DataFrame:
    if _only_specs(program):
        specs = [program] if isinstance(program, ProcessorSpec) else list(program)
        skipped: list[str] = []
    else:
        specs, skipped = processor_specs(program, lateness_ms=lateness_ms)
    column = event_column(df, specs) if json_col == AUTO else json_col
    if column is not None and isinstance(df.schema[column].dataType, BinaryType):
        df = df.withColumn(column, F.col(column).cast("string"))
    built = program_outputs(df, program, specs, skipped, json_col=column, stream=stream,
                            buckets=buckets)
    if built.outputs is None:
        raise OperatorConfigError("the program declares nothing the Spark engine runs")
    # The counts of matches held back by `unique` and of events whose device clock stayed
    # uncorrected are for run_spark's summary.
    return built.outputs.where(~F.col("kind").isin(*COUNT_KINDS))
