"""Which of a bucket's rows a rule processor needs at all, decided column-wise.

The embedded engine evaluates every rule's conditions on the whole batch with numpy
(``CompiledRule.columnar_mask``) and hands per-event Python only the rows some variable may
take; a row no variable fits cannot begin, extend or break a relaxed or ``any`` match, nor
violate a negation. The Spark operator applies the same test to a bucket's rows before grouping
them by key, so the processor's per-event work (validation, reorder buffer, NFA) is spent on
the few rows that matter, as in the embedded engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from cep.events import STREAM_FIELD
from cep.processor import must_see_every_event

__all__ = ["needed_rows"]


def needed_rows(processor: Any, events: Sequence[dict[str, Any] | None]) -> np.ndarray | None:
    """A boolean per event: whether ``processor`` may need it; ``None`` when it needs all.

    Rows that fail the stream's validation are kept (the processor dead-letters them with the
    reason), and so are the rows of streams whose rules must see every event (strict
    contiguity, ``prev``). Only processors that expose compiled ``rules`` and ``schemas`` (a
    :class:`cep.processor.RuleProcessor`) are filtered.
    """
    rules = getattr(processor, "rules", None)
    schemas = getattr(processor, "schemas", None)
    if not rules or schemas is None or not all(hasattr(r, "columnar_mask") for r in rules):
        return None
    by_stream: dict[str, list[int]] = {}
    for i, event in enumerate(events):
        if event is not None:
            stream = event.get(STREAM_FIELD)
            if isinstance(stream, str):
                by_stream.setdefault(stream, []).append(i)
    keep = np.zeros(len(events), dtype=bool)
    for stream, rows in by_stream.items():
        readers = [rule for rule in rules if stream in rule.streams]
        schema = schemas.get(stream)
        if not readers:
            continue  # no rule reads the stream: the processor ignores its rows anyway
        index = np.asarray(rows, dtype=np.int64)
        if schema is None or any(must_see_every_event(rule) for rule in readers):
            keep[index] = True
            continue
        # Only the declared fields: conditions read nothing else, and building the columns
        # field by field is several times cheaper than a frame of whole records.
        rows_here = [events[i] for i in rows]
        frame = pd.DataFrame(
            {name: [e.get(name) for e in rows_here] for name in schema.fields}
        )
        normalised, _, bad = schema.normalise_frame(frame)
        for position, _reason, _detail in bad:
            keep[index[position]] = True
        if normalised.empty:
            continue
        view = normalised
        if any(len(rule.streams) > 1 for rule in readers):
            view = normalised.assign(**{STREAM_FIELD: stream})
        wanted = np.zeros(len(normalised), dtype=bool)
        for rule in readers:
            wanted |= np.asarray(rule.columnar_mask(view), dtype=np.int64) != 0
        positions = normalised.index.to_numpy()[wanted]
        keep[index[positions]] = True
    return keep
