"""The outbox's group commit: alerts handed over by the engine's thread are written by a
background thread, everything handed over while one transaction was being written going into
the next (one ``fsync`` for a burst), so the engine's thread never waits for the disk. What
is handed over counts as queued only once it is on disk: :meth:`OutboxWriter.wait` says when.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from .errors import OutboxError
from .outbox import Outbox, QueuedAlert

__all__ = ["OutboxWriter"]


class OutboxWriter:
    """Stores the alerts handed to :meth:`put` in ``outbox`` from a background thread, as many
    at a time as were handed over while it wrote the previous ones.

    Parameters
    ----------
    outbox : Outbox
        Where the alerts go.
    on_stored : callable, optional
        Called in the writer's thread with the number of new messages after each transaction
        is on disk (to wake the delivery: nothing is sent before it is stored).

    Examples
    --------
    >>> import os, tempfile
    >>> from cep.alerts import Endpoint, Outbox, new_secret
    >>> ops = Endpoint("ops", "https://hooks.example.com/in", (new_secret(),))
    >>> outbox = Outbox(os.path.join(tempfile.mkdtemp(), "outbox.sqlite"))
    >>> writer = OutboxWriter(outbox)
    >>> ticket = writer.put(outbox.prepare([({"match_id": "m1", "name": "probe"}, [ops])]))
    >>> writer.wait(ticket)  # returns once the alert is on disk
    True
    >>> [m.msg_id for m in outbox.messages()], writer.stored
    (['m1'], 1)
    >>> writer.close(); outbox.close()
    """

    def __init__(
        self, outbox: Outbox, on_stored: Callable[[int], None] | None = None
    ) -> None:
        self._outbox = outbox
        self._on_stored = on_stored
        self._changed = threading.Condition()
        self._queue: list[QueuedAlert] = []
        self._handed = 0  # tickets given out
        self._durable = 0  # tickets whose alerts are on disk
        self._closing = False
        self.error: BaseException | None = None
        self.stored = 0
        """New messages stored so far (an alert already in the outbox is not new)."""
        self.transactions = 0
        self._thread = threading.Thread(target=self._loop, name="vigil-outbox", daemon=True)
        self._thread.start()

    def put(self, alerts: Sequence[QueuedAlert]) -> int:
        """Hand ``alerts`` over to be stored; returns at once with the ticket that
        :meth:`wait` takes.

        Raises
        ------
        OutboxError
            When the writer is closed; what an earlier transaction failed with.
        """
        with self._changed:
            self._raise_error()
            if self._closing:
                raise OutboxError(f"the writer of {self._outbox.path!r} is closed")
            self._queue.extend(alerts)
            self._handed += 1
            self._changed.notify_all()
            return self._handed

    def wait(self, ticket: int | None = None, timeout: float | None = None) -> bool:
        """Wait until the alerts of ``ticket``, and all handed over before them, are on disk
        (everything handed over so far, for ``None``); False when ``timeout`` passes first.

        Raises
        ------
        BaseException
            What a transaction failed with (the alerts of that one and those handed over since
            are not on disk).
        """
        with self._changed:
            target = self._handed if ticket is None else ticket
            done = self._changed.wait_for(
                lambda: self._durable >= target or self.error is not None, timeout
            )
            self._raise_error()
            return done

    @property
    def durable(self) -> int:
        """The last ticket whose alerts are on disk."""
        return self._durable

    def close(self) -> None:
        """Store what was handed over, then stop the thread.

        Raises
        ------
        BaseException
            What a transaction failed with.
        """
        with self._changed:
            self._closing = True
            self._changed.notify_all()
        self._thread.join()
        with self._changed:
            self._raise_error()

    def _raise_error(self) -> None:
        if self.error is not None:
            raise self.error

    def _loop(self) -> None:
        try:
            while True:
                with self._changed:
                    self._changed.wait_for(lambda: self._queue or self._closing)
                    if not self._queue:
                        return  # closing, and everything is stored
                    batch, self._queue = self._queue, []
                    ticket = self._handed
                stored = self._outbox.store(batch)
                with self._changed:
                    self._durable = ticket
                    self.stored += stored
                    self.transactions += 1
                    self._changed.notify_all()
                if self._on_stored is not None:
                    self._on_stored(stored)
        except BaseException as exc:  # raised to whoever puts or waits next
            with self._changed:
                self.error = exc
                self._changed.notify_all()
