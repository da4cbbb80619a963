"""Device clock correction: the event time of a stream that declares ``time ts sent S
received R`` is ``ts + (R - S)``, the device's reading moved by the device clock's offset from
the server's. One formula for every path (the embedded engine's events and frames, the Spark
routing that computes the watermark's times), so they cannot disagree.

An event that lacks ``sent`` or ``received`` (missing or null) keeps its device time,
uncorrected; the engines count such events (:attr:`cep.engine.EngineStats.uncorrected`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from query_lang.ast import StreamDecl

__all__ = ["DeviceClock", "corrected_ms", "corrected_column_ms"]


@dataclass(frozen=True)
class DeviceClock:
    """Where a stream's events say when they were sent (device clock) and received (server
    clock), and where the device's own event time is kept.

    Examples
    --------
    >>> from query_lang import parse
    >>> decl, = parse("stream s (ts timestamp, a timestamp, b timestamp) "
    ...               "time ts sent a received b").declarations
    >>> DeviceClock.from_decl(decl)
    DeviceClock(sent_field='a', received_field='b', device_field='ts_device')
    """

    sent_field: str
    received_field: str
    device_field: str

    @classmethod
    def from_decl(cls, decl: StreamDecl) -> DeviceClock | None:
        """The clock of ``decl``, or None when it does not declare both ``sent`` and
        ``received`` (the checker refuses one without the other)."""
        sent, received = decl.time_source("sent"), decl.time_source("received")
        device = decl.device_time_field
        if sent is None or received is None or device is None:
            return None
        return cls(sent, received, device)


def corrected_ms(happened: int, sent: int | None, received: int | None) -> tuple[int, bool]:
    """The event time of an event that happened at ``happened`` (epoch ms, device clock),
    and whether it was corrected: ``happened + (received - sent)`` when both are known, else
    ``happened`` itself.

    Examples
    --------
    >>> corrected_ms(1_000, 5_000, 65_000)  # the device is a minute behind
    (61000, True)
    >>> corrected_ms(1_000, None, 65_000)
    (1000, False)
    """
    if sent is None or received is None:
        return happened, False
    return happened + (received - sent), True


def corrected_column_ms(
    happened: np.ndarray, sent: np.ndarray, received: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`corrected_ms` of columns of epoch ms as float (``NaN`` where missing): the
    times (``NaN`` where ``happened`` is) and which rows were corrected.

    Valid times are below 2**53 ms, where float arithmetic on whole milliseconds is exact.

    Examples
    --------
    >>> nan = float("nan")
    >>> times, done = corrected_column_ms(
    ...     np.array([1_000.0, 1_000.0, nan]), np.array([5_000.0, nan, 1.0]),
    ...     np.array([65_000.0, 9.0, 2.0]))
    >>> times.tolist(), done.tolist()
    ([61000.0, 1000.0, nan], [True, False, False])
    """
    done = ~np.isnan(sent) & ~np.isnan(received) & ~np.isnan(happened)
    times = np.where(done, happened + (received - sent), happened)
    return times, done
