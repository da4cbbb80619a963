"""Alerts delivered while a run goes on: a background thread drains the outbox as matches are
queued, so that an endless run (``vigil run --follow``) sends each alert within moments of its
match instead of when the input ends.

The thread only ever calls :meth:`Dispatcher.drain` in short slices; the outbox (its own lock,
WAL journaling) is shared with the thread that queues. Retries, breakers and per-endpoint order
are the dispatcher's, unchanged. The thread never polls: it waits on one event, set when a
message is stored (:meth:`LiveDelivery.wake`) and when a request ends.
"""

from __future__ import annotations

import dataclasses
import threading
import time

from .dispatcher import Dispatcher, DrainResult

__all__ = ["LiveDelivery"]

SLICE_S = 0.5
"""Longest one drain call runs before the thread looks again at whether it must stop."""

IDLE_S = 1.0
"""Longest the thread sleeps when nothing is due (a submit wakes it at once)."""


class LiveDelivery:
    """Delivers an outbox's due messages from a background thread until :meth:`stop`.

    Parameters
    ----------
    dispatcher : Dispatcher
        The dispatcher to drain with (its breakers then live as long as the run).

    Examples
    --------
    >>> import os, tempfile, time
    >>> from cep.alerts import Endpoint, Outbox, WebhookReceiver, new_secret
    >>> secret = new_secret()
    >>> with WebhookReceiver(secret) as receiver:
    ...     ops = Endpoint("ops", receiver.url, (secret,))
    ...     outbox = Outbox(os.path.join(tempfile.mkdtemp(), "outbox.sqlite"))
    ...     live = LiveDelivery(Dispatcher(outbox, [ops]))
    ...     live.start()
    ...     _ = outbox.enqueue({"match_id": "m1", "name": "probe"}, [ops])
    ...     live.wake()
    ...     give_up = time.monotonic() + 10
    ...     while not receiver.webhook_ids and time.monotonic() < give_up:
    ...         time.sleep(0.01)
    ...     sent_while_running = receiver.webhook_ids
    ...     result = live.stop(deadline_s=5.0)
    ...     outbox.close()
    >>> sent_while_running, result.delivered, result.pending
    (['m1'], 1, 0)
    """

    def __init__(self, dispatcher: Dispatcher) -> None:
        self._dispatcher = dispatcher
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._results: list[DrainResult] = []
        self._thread = threading.Thread(target=self._loop, name="vigil-delivery", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def retarget(self, dispatcher: Dispatcher) -> None:
        """Deliver through ``dispatcher`` from the next pass on (a program change brought other
        endpoints); the totals so far are kept."""
        self._dispatcher = dispatcher
        self._wake.set()

    def wake(self) -> None:
        """Say that a message was queued: the thread drains now rather than after its nap."""
        self._wake.set()

    def stop(self, deadline_s: float) -> DrainResult:
        """Stop the thread, then deliver what is due for up to ``deadline_s`` more seconds;
        returns the totals of the whole run (``pending`` as left in the outbox).

        Raises
        ------
        BaseException
            What ended the thread early (an outbox error), after the final drain.
        """
        self._stopping.set()
        self._wake.set()
        if self._thread.is_alive():
            self._thread.join()
        try:
            self._results.append(self._dispatcher.drain(deadline_s))
        finally:
            self._dispatcher.close()
        if self.error is not None:
            raise self.error
        return _total(self._results)

    def _loop(self) -> None:
        try:
            while not self._stopping.is_set():
                self._wake.clear()
                dispatcher = self._dispatcher
                result = dispatcher.drain(SLICE_S, wake=self._wake)
                self._results.append(result)
                if self._dispatcher is not dispatcher:  # retargeted: the old one is done
                    dispatcher.close()
                nap = IDLE_S
                if result.next_attempt_at is not None:
                    nap = min(nap, max(0.0, result.next_attempt_at - time.time()))
                self._wake.wait(nap)
        except BaseException as exc:  # reported by stop(); the run's own thread goes on
            self.error = exc


def _total(results: list[DrainResult]) -> DrainResult:
    last = results[-1]
    summed = {
        name: sum(getattr(r, name) for r in results)
        for name in ("attempts", "delivered", "retried", "failed", "disabled")
    }
    unknown = sorted({name for r in results for name in r.unknown_endpoints})
    return dataclasses.replace(last, **summed, unknown_endpoints=tuple(unknown))
