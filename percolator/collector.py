"""Python's cyclic garbage collector kept from walking what lives as long as the process: paused
for the length of one batch (:func:`collector_paused`), and what a worker builds once and keeps
moved out of its generations (:func:`keep_built`). What matches documents against standing
queries, or events against rules, allocates objects by the hundred thousand that hold no
reference cycles, while the index or the rules they are matched against hold millions that live
as long as the process.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collector_paused", "keep_built"]


@contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector for the duration of a batch.

    A batch allocates documents' term sets, events, binding lists and matches by the hundred
    thousand, none of them in reference cycles; generational collections triggered by those
    allocations would walk every live object again and again (a quarter of the CPU time of a
    strict-contiguity batch; a sixth of a percolator batch at 100,000 queries) to free nothing.
    The collector's previous setting is restored afterwards.

    Examples
    --------
    >>> import gc
    >>> with collector_paused():
    ...     gc.isenabled()
    False
    >>> gc.isenabled()
    True
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def keep_built() -> None:
    """After a long-lived build (a Spark worker's compiled program, its standing queries'
    index): collect what is garbage now, including what an earlier call froze and is no
    longer kept, and move everything left into the collector's permanent generation
    (:func:`gc.freeze`), which no collection looks at.

    Full collections look at every object the process holds; a worker keeps a program of
    1,000 rules (hundreds of thousands of objects) as long as it lives, and each micro-batch
    decodes and drops many key states, which sets them off: on the W5 benchmark's 1,000 rules
    on ``local[2]`` they took 3.9 and 4.3 s of the two workers' 17.6 s in the operator, each
    looking at the same rules again (``docs/spark.md``). Frozen objects are still freed when
    nothing refers to them; only cycles among them wait for the next call, which brings them
    back (:func:`gc.unfreeze`) and collects them, so a program a worker stops keeping (an
    edit, a live program's older version) is not held for good. It moves the whole process's
    heap, so only a worker's builds call it (``tests/spark_udf/test_shipped.py`` checks it in
    a process of its own).
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()
