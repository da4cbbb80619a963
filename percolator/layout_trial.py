"""Choosing between two equivalent layouts of a segment by timing both on the stream itself.

Which layout of a large sealed segment selects candidates faster depends on the queries and the
documents, not on their number alone: flat arrays (:mod:`percolator.columnar`) pay for every
atom a document holds and win where each document reaches many postings; the Python postings
pay only for the keys a document holds and win where those are few (docs/benchmarks.md: at 1M
queries flat arrays are 1.3x faster on the co-occurring mix and 2.3x slower on the alerts mix).
Both give the same candidates, so the segment can keep both for a while, serve documents from
each in turn, and keep the one that spent less time per document.
"""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["FLAT", "POSTINGS", "TRIAL_DOCUMENTS", "WARM_DOCUMENTS", "LayoutTrial"]

FLAT = "flat"
POSTINGS = "postings"

#: Documents each layout serves before its time counts: both learn the stream's terms at first.
WARM_DOCUMENTS = 64
#: Documents each layout serves, timed, before the faster one is chosen.
TRIAL_DOCUMENTS = 512


class LayoutTrial:
    """Alternates two layouts call by call, times each (CPU time of the calling thread), and
    names the faster per document once each has served ``trial`` timed documents.

    Examples
    --------
    >>> ticks = iter(range(0, 10_000, 1))
    >>> trial = LayoutTrial(warm=0, trial=2, clock=lambda: next(ticks))
    >>> trial.next_layout()
    'flat'
    >>> trial.record("flat", 2, 0.0, 10.0); trial.record("postings", 2, 0.0, 4.0)
    >>> trial.winner
    'postings'
    """

    __slots__ = ("clock", "warm", "trial", "winner", "_docs", "_seconds", "_turn")

    def __init__(
        self,
        warm: int = WARM_DOCUMENTS,
        trial: int = TRIAL_DOCUMENTS,
        clock: Callable[[], float] = time.thread_time,
    ) -> None:
        self.clock = clock
        self.warm = warm
        self.trial = trial
        #: FLAT or POSTINGS once chosen, None while the trial runs.
        self.winner: str | None = None
        self._docs = {FLAT: 0, POSTINGS: 0}
        self._seconds = {FLAT: 0.0, POSTINGS: 0.0}
        self._turn = 0

    def next_layout(self) -> str:
        """The layout that serves the next call: the winner once chosen, else each in turn."""
        if self.winner is not None:
            return self.winner
        self._turn += 1
        return FLAT if self._turn % 2 else POSTINGS

    def record(self, layout: str, documents: int, started: float, finished: float) -> None:
        """Count a call of ``layout`` that served ``documents`` between two clock readings;
        the documents a layout serves first, up to ``warm``, are not timed."""
        docs = self._docs[layout] + documents
        self._docs[layout] = docs
        if docs > self.warm:
            timed = min(documents, docs - self.warm)
            self._seconds[layout] += (finished - started) * timed / documents
        if self.winner is None and all(d >= self.warm + self.trial for d in self._docs.values()):
            flat = self._seconds[FLAT] / (self._docs[FLAT] - self.warm)
            postings = self._seconds[POSTINGS] / (self._docs[POSTINGS] - self.warm)
            self.winner = FLAT if flat < postings else POSTINGS

    def per_document(self) -> dict[str, float]:
        """Seconds per timed document of each layout so far (0 where none was timed)."""
        return {
            layout: seconds / max(self._docs[layout] - self.warm, 1) if seconds else 0.0
            for layout, seconds in self._seconds.items()
        }
