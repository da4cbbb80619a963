"""What a Python worker builds once and keeps (a program's compiled processors) kept out of the
garbage collector's full collections.

CPython's collector looks at every tracked object it holds in its oldest generation each time
that generation is collected. A worker serving a program of 1,000 rules holds the compiled
rules (hundreds of thousands of objects) for as long as it lives, and each micro-batch decodes
and drops many key states, which sets off full collections: on ``local[2]`` they took 3.9 and
4.3 s of the two workers' ~17.6 s in the operator over the W5 benchmark's 1,000-rule run
(``docs/benchmarks.md``), each looking again at the same rules. Once a worker has built a
program, :func:`keep_built` moves everything alive into the permanent generation
(:func:`gc.freeze`), which no collection looks at. Such objects are still freed when nothing
refers to them; only cycles among them wait, until the next build brings them back
(:func:`gc.unfreeze`) and collects them, so a program a worker stops keeping (an edit, a live
program's older version) is not held for good.
"""

from __future__ import annotations

import gc

__all__ = ["keep_built"]


def keep_built() -> None:
    """After a long-lived build: collect what is garbage now (including what an earlier call
    froze and is no longer kept) and move everything left into the permanent generation.

    Called where a worker process keeps what it built (:mod:`spark_udf.shipped`,
    :meth:`spark_udf.live.LiveProgram.compiled`); ``tests/spark_udf/test_shipped.py`` checks
    it in a process of its own, as it moves the whole process's heap.
    """
    gc.unfreeze()
    gc.collect()
    gc.freeze()
