"""From a Vigil program to Spark operators: the program's rules grouped by key definition, one
:class:`cep.nfa.RuleProcessor` each, with the columns Spark needs (key, time, lateness)."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pyspark.sql import DataFrame

from cep.engine import StandingQueries, load_declarations
from cep.engine.program import (
    add_declarations,
    compile_program_rule,
    lookup_horizons,
)
from cep.events.event import StreamSchema
from cep.events.time_bounds import DEFAULT_AHEAD_MS
from cep.metrics.processor import MetricProcessor
from cep.nfa.processor import RuleProcessor, key_signature
from cep.tables import TableFeed, Tables
from query_lang import ast
from spark_udf.errors import OperatorConfigError
from spark_udf.input_plan import ahead_of, clock_of, json_route, routed_layout
from spark_udf.operator import detect, detect_plan
from spark_udf.routing import DEFAULT_BUCKETS, RoutePlan, check_buckets
from spark_udf.shipped import shipped

__all__ = ["ProcessorSpec", "detect_specs", "processor_specs", "route_specs"]

ProgramSource = str | os.PathLike | ast.Module | Sequence[ast.Module]


@dataclass(frozen=True)
class ProcessorSpec:
    """A keyed processor and how Spark finds its events' key and time: for a program, the
    rules sharing one key definition; any :class:`cep.events.keyed.KeyedProcessor` fits.

    Attributes
    ----------
    processor:
        The processor (a :class:`~cep.nfa.processor.RuleProcessor` for rules), pickled to the
        executors.
    rules:
        Names of the rules (or other standing queries) it runs, for reports.
    key_cols:
        Stream -> its key fields, in key order.
    time_cols:
        Stream -> its event-time field.
    time_units:
        Stream -> ``"s"`` or ``"ms"``: the unit of epoch numbers in its time field.
    lateness_ms:
        The largest lateness over the streams (Spark keeps one watermark per query).
    default_stream:
        Stream of events that name none (the program declares exactly one stream).
    broadcast:
        Changelog streams whose rows reach every bucket (tables looked up by another key than
        the rules', see :func:`_processor_tables`).
    """

    processor: Any
    rules: tuple[str, ...]
    key_cols: Mapping[str, tuple[str, ...]]
    time_cols: Mapping[str, str]
    time_units: Mapping[str, str]
    lateness_ms: int
    default_stream: str | None = None
    broadcast: frozenset[str] = frozenset()


def processor_specs(
    program: ProgramSource,
    *,
    lateness_ms: int | None = None,
    versions: Mapping[str, int] | None = None,
) -> tuple[list[ProcessorSpec], list[str]]:
    """Compile a program (rule file path, DSL text or parsed modules) into processor specs,
    each rule and metric at its version in ``versions`` (default 1; a rerun of an edited
    program numbers them, see :mod:`spark_udf.edits`).

    Rules sharing a key definition share one :class:`~cep.nfa.processor.RuleProcessor`; each metric
    gets a :class:`~cep.metrics.processor.MetricProcessor` keyed by its ``by`` group. Returns the
    specs and the names of the declarations they do not run (queries, which
    :func:`spark_udf.query_outputs` runs per partition), so callers can say so.

    Raises
    ------
    query_lang.errors.VigilError
        When the program does not parse or check.
    OperatorConfigError
        When the program declares nothing to run (a program of queries only gives no spec).

    Examples
    --------
    >>> specs, unkeyed = processor_specs('''
    ... stream txn (card_id string, amount float, ts timestamp) time ts
    ... rule big from txn by card_id pattern b define b as amount > 100
    ... rule bigger from txn by card_id pattern b define b as amount > 1000
    ... query acme from txn match card_id:acme
    ... ''')
    >>> [(spec.rules, spec.key_cols, spec.time_cols) for spec in specs]
    [(('big', 'bigger'), {'txn': ('card_id',)}, {'txn': 'ts'})]
    >>> unkeyed
    ['acme']
    """
    # Loaded, checked and compiled as Engine.register does, in the same order, so a program
    # fails here with the embedded engine's errors; no Engine is built around it.
    declarations = load_declarations(program)
    streams, lists = add_declarations(declarations, {}, {}, ())
    rule_decls = [d for d in declarations if isinstance(d, ast.RuleDecl)]
    standing = [d for d in declarations if isinstance(d, ast.QueryDecl | ast.MetricDecl)]
    versions = versions or {}
    tables = Tables()
    for decl in declarations:
        if isinstance(decl, ast.TableDecl):
            tables.add(TableFeed(decl, streams[decl.stream]))
    rules = [
        compile_program_rule(decl, streams, lists, version=versions.get(decl.name, 1),
                             tables=tables.readers)
        for decl in rule_decls
    ]
    # Queries must compile too; the metrics compiled here are the ones the processors run.
    metrics = [
        (decl, operator.compiled) for decl, operator in StandingQueries(lateness_ms).compile(
            standing, streams, lists, versions, tables.readers
        ) if isinstance(decl, ast.MetricDecl)
    ]
    compiled_metrics = [metric for _, metric in metrics]
    for name, horizon in lookup_horizons(rule_decls, compiled_metrics).items():
        tables.widen(name, horizon)
    if not rules and not standing:
        raise OperatorConfigError(
            "the program declares no rule, query or metric for the Spark operator to run"
        )
    schemas = {name: StreamSchema.from_decl(d, lateness_ms=lateness_ms)
               for name, d in streams.items()}
    by_signature: dict[tuple, list[Any]] = {}
    for rule in rules:
        by_signature.setdefault(key_signature(rule), []).append(rule)
    processors: list[tuple[Any, tuple[str, ...]]] = [
        (RuleProcessor(group, streams, lateness_ms=lateness_ms), tuple(r.name for r in group))
        for group in by_signature.values()
    ]
    decls = {d.name: d for d in rule_decls}
    for processor, names in processors:
        processor.tables = _processor_tables(
            [decls[n] for n in names], processor, tables, streams
        )
    for decl, metric in metrics:
        processor = MetricProcessor(metric, streams, lateness_ms=lateness_ms)
        processor.tables = _processor_tables([decl], processor, tables, streams)
        processors.append((processor, (decl.name,)))
    specs = [_spec(processor, names, schemas) for processor, names in processors]
    # Queries are not keyed: spark_udf.queries runs them per partition.
    return specs, sorted(d.name for d in standing if isinstance(d, ast.QueryDecl))


def _processor_tables(
    rules: Sequence[ast.RuleDecl | ast.MetricDecl],
    processor: Any,
    tables: Tables,
    streams: Mapping[str, ast.StreamDecl],
) -> Tables | None:
    """The tables a processor's rules (or its metric) look up, kept in its buckets beside the
    keys (a metric's keys are its ``by`` groups).

    A table every lookup reads by the rule's own key (``lookup(cards, card_id)`` in a rule
    ``by card_id``, of the same declared types) is *partitioned*: its changelog rows are routed
    by the table's key as the rules' events are by theirs, so a bucket holds its keys' rows.
    A table read by another key (a merchant watch list in a rule keyed by card) is
    *broadcast*: its changelog rows reach every bucket, and each holds the whole table.

    Raises
    ------
    OperatorConfigError
        When the processor's rules also read a broadcast table's changelog stream as events
        (its rows would reach every bucket twice over).
    """
    used: dict[str, None] = {}
    broadcast: set[str] = set()
    own = {stream: tuple(fields) for stream, fields in processor.key_fields.items()}
    for rule in rules:
        for node in ast.walk(rule):
            if not isinstance(node, ast.Lookup):
                continue
            decl = tables.feed(node.table).decl
            given = tuple(k.name if isinstance(k, ast.FieldRef) and k.qualifier is None
                          else None for k in node.keys)
            same_types = all(
                streams[s].field_type(f) == streams[decl.stream].field_type(k)
                for s, fields in own.items() for f, k in zip(fields, decl.key, strict=False)
            )
            if any(given != fields for fields in own.values()) or not same_types:
                broadcast.add(decl.stream)
            used[node.table] = None
    if not used:
        return None
    for stream in sorted(broadcast & set(own)):
        raise OperatorConfigError(
            f"rules keyed by {', '.join(own[stream])} read stream '{stream}' as events and look "
            "up a table it feeds by another key: on Spark its rows would reach every bucket "
            "for the table and their key's bucket for the rules; declare the changelog as two "
            "streams, or run the embedded engine"
        )
    part = tables.subset(used)
    # A stream broadcast for one table reaches every bucket: its other tables are whole too.
    part.broadcast = frozenset(broadcast)
    return part


def _spec(
    processor: Any, names: tuple[str, ...], schemas: Mapping[str, StreamSchema]
) -> ProcessorSpec:
    key_cols = {s: tuple(fields) for s, fields in processor.key_fields.items()}
    tables = getattr(processor, "tables", None)
    for feed in tables.feeds() if tables is not None else ():
        # Changelog rows route by the table's key into the buckets of the rules' keys (or, for
        # a broadcast stream, into every bucket: its key is never read).
        known = key_cols.setdefault(feed.decl.stream, tuple(feed.decl.key))
        if known != tuple(feed.decl.key) and feed.decl.stream not in tables.broadcast:
            raise OperatorConfigError(
                f"table '{feed.name}' is keyed by {', '.join(feed.decl.key)}, but rules of the "
                f"same key read its stream '{feed.decl.stream}' by {', '.join(known)}"
            )
    streams = sorted(key_cols)
    time_cols = {}
    for stream in streams:
        field = schemas[stream].time_field
        if field is None:
            raise OperatorConfigError(f"stream '{stream}' declares no event-time field")
        time_cols[stream] = field
    return ProcessorSpec(
        processor=processor,
        rules=names,
        key_cols={s: key_cols[s] for s in streams},
        time_cols=time_cols,
        time_units={s: "ms" if schemas[s].epoch_unit_ms == 1 else "s" for s in streams},
        lateness_ms=max(schemas[s].lateness_ms for s in streams),
        default_stream=next(iter(schemas)) if len(schemas) == 1 else None,
        broadcast=tables.broadcast if tables is not None else frozenset(),
    )


def route_specs(
    columns: Mapping[str, Any],
    specs: Sequence[ProcessorSpec],
    *,
    json_col: str | None = "_event",
    stream: str | None = None,
    buckets: int = DEFAULT_BUCKETS,
    slots: Sequence[int] | None = None,
) -> RoutePlan | None:
    """One :class:`~spark_udf.routing.RoutePlan` for every spec over a frame with these columns
    (name -> Spark type), or ``None`` when some spec's stream, key or time is not in the JSON
    text column (those run through :func:`spark_udf.detect`'s Spark expressions). ``slots``
    places each spec's state groups (:mod:`spark_udf.edits`; default: by index)."""
    check_buckets(buckets)
    if json_col is None or json_col not in columns or not specs:
        return None
    entries = []
    for spec in specs:
        default = stream if stream is not None else spec.default_stream
        route = json_route(list(columns), json_col, spec.key_cols, spec.time_cols,
                           spec.time_units, default, buckets,
                           ahead_of(spec.processor) or DEFAULT_AHEAD_MS,
                           clocks=clock_of(spec.processor))
        if route is None:
            return None
        route = replace(route, broadcast=spec.broadcast)
        # Shipped as bytes built once per Python worker, not unpickled by every task.
        entries.append((route, shipped(spec.processor), routed_layout(columns, json_col, default)))
    # A processor of one stream times every row by its time field; the rows of another
    # processor's clock-corrected stream take their corrected time instead, so that the
    # watermark is never moved by a device's clock.
    clocked = {
        name: route.streams.get(name) or route.streams[None]
        for (route, _, _), spec in zip(entries, specs, strict=True)
        for name in clock_of(spec.processor) if name in spec.time_cols
    }
    entries = [
        (replace(route, clocked={n: r for n, r in clocked.items() if n not in spec.time_cols}),
         processor, layout)
        for (route, processor, layout), spec in zip(entries, specs, strict=True)
    ]
    return RoutePlan(tuple(entries), buckets, max(spec.lateness_ms for spec in specs),
                     None if slots is None else tuple(slots), clock_streams=frozenset(clocked))


def detect_specs(
    df: DataFrame,
    specs: Sequence[ProcessorSpec],
    *,
    json_col: str | None = "_event",
    stream: str | None = None,
    buckets: int = DEFAULT_BUCKETS,
    layout: str = "bucketed",
) -> DataFrame:
    """:func:`spark_udf.detect` for every spec over the same events, outputs unioned. A
    streaming frame of JSON text runs every spec in one stateful operator (one read of the
    input, one shuffle; see :func:`route_specs`).

    Examples
    --------
    Each rule's key and time fields come from its spec (``spark`` is a SparkSession):

    >>> specs, _ = processor_specs('''
    ... stream txn (card_id string, amount float, ts timestamp) time ts
    ... rule big from txn by card_id pattern b define b as amount > 100
    ... ''')
    >>> events = spark.createDataFrame([
    ...     ('{"card_id": "c1", "amount": 500, "ts": "2026-01-01T00:00:00Z"}',),
    ... ], "_event string")
    >>> [(row.name, row.key) for row in detect_specs(events, specs).collect()]
    [('big', '{"card_id":"c1"}')]
    """
    if not specs:
        raise OperatorConfigError("no processor to run")
    tabled = [spec for spec in specs if getattr(spec.processor, "tables", None)]
    if tabled and layout != "bucketed":
        raise OperatorConfigError(
            f"rules {', '.join(tabled[0].rules)} look up tables, which live in the buckets of "
            f"the bucketed layout; the {layout} layout keeps one key's state and no table"
        )
    several = [spec for spec in specs if getattr(spec.processor, "multi_key", False)]
    if several and layout != "bucketed":
        raise OperatorConfigError(
            f"rule {several[0].rules[0]} has steps with their own `by`, so an event belongs to "
            f"several keys, which the buckets of the bucketed layout split; the {layout} layout "
            "keeps one key's state"
        )
    if df.isStreaming and layout == "bucketed":
        types = {f.name: f.dataType for f in df.schema.fields}
        plan = route_specs(types, specs, json_col=json_col, stream=stream, buckets=buckets)
        if plan is not None:
            return detect_plan(df, plan)
    for spec in specs:
        if spec.broadcast:
            # A table read by another key than the rules' reaches every bucket through the
            # routing of JSON text only.
            raise OperatorConfigError(
                f"stream '{sorted(spec.broadcast)[0]}' feeds a table looked up by another key "
                "than its rules'; on Spark that runs over a streaming frame of JSON text "
                "(vigil run, read_jsonl with a route plan) in the bucketed layout, not over "
                "this frame"
            )
        corrected = sorted(clock_of(spec.processor))
        if corrected:
            # Spark's own time expressions (detect over typed columns or a static frame) do
            # not correct device clocks: refused rather than watermarked by another time.
            raise OperatorConfigError(
                f"stream '{corrected[0]}' corrects its device clock (`time ... sent ... "
                "received ...`); on Spark that runs over a streaming frame of JSON text "
                "(vigil run, read_jsonl with a route plan), not over this frame"
            )
    outputs = [
        detect(
            df, spec.processor, key_cols=spec.key_cols, time_col=spec.time_cols,
            time_unit=spec.time_units, lateness=spec.lateness_ms, json_col=json_col,
            stream=stream if stream is not None else spec.default_stream, buckets=buckets,
            layout=layout,
        )
        for spec in specs
    ]
    result = outputs[0]
    for other in outputs[1:]:
        result = result.unionByName(other)
    return result
