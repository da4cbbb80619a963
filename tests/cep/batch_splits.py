"""Feeding rows to an engine in batches cut where a Hypothesis test chose, so that its tests
can hold a batched run equal to one fed row by row."""

from __future__ import annotations

import pandas as pd

from cep.engine import Engine


def feed_batches(engine: Engine, rows: list[dict], cuts: list[int]) -> None:
    """``rows`` as frames cut at ``cuts`` (each taken modulo ``len(rows) + 1``)."""
    bounds = sorted({0, len(rows), *(c % (len(rows) + 1) for c in cuts)})
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        if hi > lo:
            engine.feed_batch(pd.DataFrame(rows[lo:hi]))
