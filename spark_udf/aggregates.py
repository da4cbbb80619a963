"""Sketch aggregates on Spark DataFrames: approximate distinct counts (HyperLogLog++) and
quantiles (t-digest) per group, built as partial sketches on each executor and merged on reduce,
with the same sketches and hashing as the embedded ``metric`` operator.

The plan is two steps: ``mapInPandas`` folds each partition into one partial sketch per group
and serialises it (``Sketch.to_bytes``); ``groupBy(...).applyInPandas`` merges a group's partial
bytes and estimates. HyperLogLog registers merge exactly, so the estimate equals that of one
sketch over all the data, however Spark partitioned it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from pyspark.sql import DataFrame

from cep.metrics.operator import HLL_PRECISION, TDIGEST_COMPRESSION
from query_lang.compiler import normalise_value
from sketches import HyperLogLog, Sketch, TDigest, from_bytes
from spark_udf.errors import OperatorConfigError

__all__ = ["SketchSpec", "approx_distinct", "approx_percentile", "sketch_agg"]

_KINDS = ("hll", "tdigest")


@dataclass(frozen=True)
class SketchSpec:
    """One output of :func:`sketch_agg`: a sketch ``kind`` over ``column``.

    ``kind`` is ``"hll"`` (the value is the distinct count, an integer) or ``"tdigest"`` (the
    value is the ``quantile``-quantile, a float; null for a group without numbers).
    """

    kind: str
    column: str
    quantile: float | None = None

    @classmethod
    def parse(cls, name: str, spec: Any) -> SketchSpec:
        """Read ``("hll", column)`` or ``("tdigest", column, q)`` (or a SketchSpec)."""
        if isinstance(spec, SketchSpec):
            parsed = spec
        elif isinstance(spec, tuple | list) and 2 <= len(spec) <= 3:
            parsed = cls(*spec)
        else:
            raise OperatorConfigError(
                f"sketch '{name}': expected ('hll', column) or ('tdigest', column, quantile), "
                f"got {spec!r}"
            )
        if parsed.kind not in _KINDS:
            raise OperatorConfigError(
                f"sketch '{name}': unknown kind {parsed.kind!r}; expected one of {_KINDS}"
            )
        if parsed.kind == "tdigest":
            q = parsed.quantile
            if isinstance(q, bool) or not isinstance(q, int | float) or not 0 <= q <= 1:
                raise OperatorConfigError(
                    f"sketch '{name}': a t-digest needs a quantile from 0 to 1, as in "
                    f"('tdigest', '{parsed.column}', 0.99); got {q!r}"
                )
        elif parsed.quantile is not None:
            raise OperatorConfigError(f"sketch '{name}': a HyperLogLog takes no quantile")
        return parsed

    def new(self) -> Sketch:
        if self.kind == "hll":
            return HyperLogLog(HLL_PRECISION)
        return TDigest(TDIGEST_COMPRESSION)

    def update(self, sketch: Sketch, values: pd.Series) -> None:
        """Add a column's non-null values as the embedded operator would."""
        if self.kind == "hll":
            values = values.dropna()
            if len(values):
                sketch.update(values)
            return
        numbers = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64)
        numbers = numbers[np.isfinite(numbers)]
        if len(numbers):
            sketch.update(numbers)

    def value(self, sketch: Sketch) -> Any:
        if self.kind == "hll":
            return int(round(sketch.estimate()))
        return None if sketch.is_empty else float(sketch.quantile(self.quantile))

    @property
    def spark_type(self) -> str:
        return "long" if self.kind == "hll" else "double"


def sketch_agg(
    df: DataFrame,
    group_cols: Sequence[str],
    specs: Mapping[str, Any],
    *,
    keep_sketches: bool = False,
) -> DataFrame:
    """Approximate aggregates of ``df`` per group, from mergeable sketches.

    Parameters
    ----------
    df:
        Any DataFrame holding ``group_cols`` and the columns the specs read.
    group_cols:
        Columns to group by (nulls form their own group); empty for one overall row.
    specs:
        Output name -> ``("hll", column)`` or ``("tdigest", column, quantile)``.
    keep_sketches:
        Also return each merged sketch's bytes in a binary column ``<name>_sketch``, which
        ``sketches.from_bytes`` reads (for merging further, such as across days).

    Returns
    -------
    DataFrame
        ``group_cols`` then one column per spec (``long`` for hll, ``double`` for tdigest),
        each followed by its ``_sketch`` column when ``keep_sketches``.

    Raises
    ------
    OperatorConfigError
        For a malformed spec, or a column that ``df`` does not have.

    Examples
    --------
    With ``spark`` a SparkSession:

    >>> df = spark.createDataFrame(
    ...     [("m1", "c1", 10.0), ("m1", "c2", 20.0), ("m1", "c1", 30.0), ("m2", "c3", 5.0)],
    ...     "merchant string, card_id string, amount double",
    ... )
    >>> out = sketch_agg(df, ["merchant"], {
    ...     "cards": ("hll", "card_id"), "median": ("tdigest", "amount", 0.5),
    ... })
    >>> sorted(tuple(row) for row in out.collect())
    [('m1', 2, 20.0), ('m2', 1, 5.0)]
    """
    group_cols = list(group_cols)
    parsed = {name: SketchSpec.parse(name, spec) for name, spec in specs.items()}
    if not parsed:
        raise OperatorConfigError("sketch_agg needs at least one sketch spec")
    missing = [c for c in [*group_cols, *(s.column for s in parsed.values())]
               if c not in df.columns]
    if missing:
        raise OperatorConfigError(
            f"sketch_agg: column '{missing[0]}' is not in the DataFrame ({', '.join(df.columns)})"
        )
    clashes = [n for n in parsed if n in group_cols or f"{n}_sketch" in group_cols]
    if clashes:
        raise OperatorConfigError(f"sketch_agg: output '{clashes[0]}' is also a group column")
    names = list(parsed)
    slots = [f"_vigil_sketch_{i}" for i in range(len(names))]
    group_fields = [df.schema[c] for c in group_cols]
    group_ddl = [f"`{f.name}` {f.dataType.simpleString()}" for f in group_fields]
    partial_schema = ", ".join([*group_ddl, *(f"`{s}` binary" for s in slots)])
    needed = list(dict.fromkeys([*group_cols, *(s.column for s in parsed.values())]))
    specs_in_order = [parsed[n] for n in names]

    def partial(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        yield _partial_sketches(batches, group_cols, specs_in_order, slots)

    partials = df.select(*needed).mapInPandas(partial, schema=partial_schema)

    out_ddl = list(group_ddl)
    for name, spec in zip(names, specs_in_order, strict=True):
        out_ddl.append(f"`{name}` {spec.spark_type}")
        if keep_sketches:
            out_ddl.append(f"`{name}_sketch` binary")

    def merge(pdf: pd.DataFrame) -> pd.DataFrame:
        return _merge_sketches(pdf, group_cols, names, specs_in_order, slots, keep_sketches)

    grouped = partials.groupBy(*group_cols) if group_cols else partials.groupBy()
    return grouped.applyInPandas(merge, schema=", ".join(out_ddl))


def _group_key(values: Sequence[Any]) -> tuple:
    return tuple(normalise_value(v) for v in values)


def _partial_sketches(
    batches: Iterator[pd.DataFrame],
    group_cols: list[str],
    specs: list[SketchSpec],
    slots: list[str],
) -> pd.DataFrame:
    """One row per group of the whole partition, with each spec's partial sketch as bytes."""
    sketches: dict[tuple, list[Sketch]] = {}
    for pdf in batches:
        if not len(pdf):
            continue
        if group_cols:
            grouped = pdf.groupby(group_cols, dropna=False, sort=False)
            parts = ((k if isinstance(k, tuple) else (k,), g) for k, g in grouped)
        else:
            parts = iter([((), pdf)])
        for raw_key, part in parts:
            key = _group_key(raw_key)
            held = sketches.get(key)
            if held is None:
                held = sketches[key] = [spec.new() for spec in specs]
            for spec, sketch in zip(specs, held, strict=True):
                spec.update(sketch, part[spec.column])
    rows = []
    for key, held in sketches.items():
        row: dict[str, Any] = dict(zip(group_cols, key, strict=True))
        row.update({slot: sketch.to_bytes() for slot, sketch in zip(slots, held, strict=True)})
        rows.append(row)
    frame = pd.DataFrame(rows, columns=[*group_cols, *slots])
    for column in group_cols:
        frame[column] = frame[column].astype(object)  # keep None, not NaN, for Arrow
    return frame


def _merge_sketches(
    pdf: pd.DataFrame,
    group_cols: list[str],
    names: list[str],
    specs: list[SketchSpec],
    slots: list[str],
    keep_sketches: bool,
) -> pd.DataFrame:
    row: dict[str, Any] = {}
    for column in group_cols:
        row[column] = normalise_value(pdf[column].iloc[0]) if len(pdf) else None
    for name, spec, slot in zip(names, specs, slots, strict=True):
        merged = spec.new()
        for data in pdf[slot]:
            merged.merge(from_bytes(bytes(data)))
        row[name] = spec.value(merged)
        if keep_sketches:
            row[f"{name}_sketch"] = merged.to_bytes()
    columns = [*group_cols]
    for name in names:
        columns.append(name)
        if keep_sketches:
            columns.append(f"{name}_sketch")
    frame = pd.DataFrame([row], columns=columns)
    for column in group_cols:
        frame[column] = frame[column].astype(object)
    return frame


def approx_distinct(
    df: DataFrame,
    group_cols: Sequence[str],
    column: str,
    *,
    name: str = "approx_distinct",
    keep_sketch: bool = False,
) -> DataFrame:
    """Approximate number of distinct non-null values of ``column`` per group (HyperLogLog++,
    ``p = 14``, as the embedded ``approx_distinct``); with ``keep_sketch``, also the merged
    sketch's bytes in ``<name>_sketch``.

    Examples
    --------
    >>> df = spark.createDataFrame([("c1",), ("c2",), ("c1",), (None,)], "card_id string")
    >>> approx_distinct(df, [], "card_id", name="cards").collect()[0].cards
    2
    """
    return sketch_agg(df, group_cols, {name: ("hll", column)}, keep_sketches=keep_sketch)


def approx_percentile(
    df: DataFrame,
    group_cols: Sequence[str],
    column: str,
    q: float,
    *,
    name: str = "approx_percentile",
    keep_sketch: bool = False,
) -> DataFrame:
    """Approximate ``q``-quantile of the finite numbers of ``column`` per group (t-digest,
    compression 100, as the embedded ``approx_percentile``); with ``keep_sketch``, also the
    merged digest's bytes in ``<name>_sketch``.

    Examples
    --------
    >>> df = spark.createDataFrame([(float(n),) for n in range(1, 100)], "amount double")
    >>> approx_percentile(df, [], "amount", 0.5, name="median").collect()[0].median
    50.0
    """
    return sketch_agg(df, group_cols, {name: ("tdigest", column, q)}, keep_sketches=keep_sketch)
