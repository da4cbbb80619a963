"""Alert routing, between the engine and webhook delivery: which matches alert whom (``notify``),
throttling, and the durable outbox they are written to — before the engine moves on
(:meth:`AlertSink.submit_many`), or by the outbox's writer thread while it goes on
(:meth:`AlertSink.queue_many`, then :meth:`AlertSink.flush` before its input is
acknowledged)."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from query_lang import Program, ast
from query_lang.timestamps import parse_iso_ms

from .delivery import LiveDelivery
from .dispatcher import Dispatcher, DrainResult
from .endpoint import Endpoint
from .errors import AlertConfigError
from .outbox import Outbox
from .throttle import Throttle
from .writer import OutboxWriter

DEFAULT_OUTBOX = os.path.join("out", "outbox.sqlite")


def endpoints_from_program(
    program: Program,
    env: Mapping[str, str] | None = None,
    *,
    unset: dict[str, str] | None = None,
) -> dict[str, Endpoint]:
    """One :class:`Endpoint` per ``webhook`` declaration, with secrets read from ``env``.

    With ``unset`` (a dict), a webhook whose secret variable is not set is left out and its
    message recorded there under its name, instead of raising.

    Raises
    ------
    AlertConfigError
        Naming the webhook and the environment variable when a secret is missing.
    """
    env = os.environ if env is None else env
    endpoints: dict[str, Endpoint] = {}
    for name, decl in program.webhooks.items():
        secrets = []
        for secret in decl.secrets:
            if secret.env is not None:
                value = env.get(secret.env)
                if not value:
                    message = (
                        f"webhook '{name}' ({_where(decl)}) reads its secret from "
                        f"${secret.env}, which is not set"
                    )
                    if unset is None:
                        raise AlertConfigError(message)
                    unset[name] = message
                    break
                secrets.append(value)
            elif secret.value is not None:
                secrets.append(secret.value)
        if unset is not None and name in unset:
            continue
        if not secrets:
            raise AlertConfigError(
                f"webhook '{name}' ({_where(decl)}) has no secret; add: secret env VARIABLE"
            )
        endpoints[name] = Endpoint(name, decl.url, tuple(secrets))
    return endpoints


def _where(decl: ast.Node) -> str:
    return f"{decl.span.file}:{decl.span.line}"


def _time_ms(text: str | None) -> int:
    if not text:
        return 0
    ms = parse_iso_ms(text)
    if ms is None:
        raise ValueError(f"match time {text!r} is not an ISO-8601 time")
    return ms


@dataclass
class AlertSink:
    """Takes every match; enqueues those whose rule, query or metric has ``notify``.

    A match is written to the outbox (durably) before :meth:`submit` returns, so an engine
    that acknowledges input after ``submit`` never loses an alert. :meth:`queue_many` hands
    the alerts to the outbox's writer thread instead and returns at once; an engine that uses
    it acknowledges input only after :meth:`flush`. ``throttle D`` lets one alert per
    (name, key) through per interval of event time; the rest are counted.

    Opened with ``unset_ok``, webhooks whose secret is not set are left out (``unset``: name
    -> why) and the alerts for them counted in ``unsent`` (per match and webhook), for the
    caller to report.
    """

    program: Program
    outbox: Outbox
    endpoints: dict[str, Endpoint]
    throttles: dict[str, Throttle] = field(default_factory=dict)
    enqueued: int = 0
    throttled: int = 0
    unset: dict[str, str] = field(default_factory=dict)
    unsent: int = 0
    live: LiveDelivery | None = None
    writer: OutboxWriter | None = None

    @classmethod
    def open(
        cls,
        program: Program,
        outbox_path: str,
        env: Mapping[str, str] | None = None,
        *,
        unset_ok: bool = False,
    ) -> AlertSink:
        unset: dict[str, str] | None = {} if unset_ok else None
        endpoints = endpoints_from_program(program, env, unset=unset)
        directory = os.path.dirname(outbox_path)
        if directory:
            os.makedirs(directory, exist_ok=True)
        sink = cls(program, Outbox(outbox_path), endpoints, unset=unset or {})
        for decl in _standing(program).values():
            if decl.throttle is not None:
                sink.throttles[decl.name] = Throttle(decl.throttle.ms)
        return sink

    def submit(self, match: dict) -> bool:
        """Enqueue ``match`` for its declaration's webhooks; False when nobody is notified or
        the throttle held it back."""
        return self.submit_many([match]) == 1

    def submit_many(self, matches: Sequence[dict]) -> int:
        """Enqueue each match of ``matches`` as :meth:`submit` does, in one outbox transaction
        (a batch's alerts cost one write to disk); returns how many were for someone."""
        items = self._items(matches)
        if not items:
            return 0
        if self.writer is not None:  # after what was queued before, in the same order
            self.writer.wait(self.writer.put(self.outbox.prepare(items)))
            return len(items)
        self.enqueued += self.outbox.enqueue_many(items)
        if self.live is not None:
            self.live.wake()
        return len(items)

    def queue_many(self, matches: Sequence[dict]) -> int:
        """Hand the alerts of ``matches`` to the outbox's writer thread and return at once
        (how many were for someone). The writer stores them with whatever else was handed over
        meanwhile, in one transaction, and the delivery sends them once they are on disk; they
        count as queued (input that produced them may be acknowledged) only after
        :meth:`flush`.

        Raises
        ------
        InvalidMatchError
            If a match has no usable ``match_id`` or is not JSON-serialisable (checked here,
            before anything is handed over).
        OutboxError
            What an earlier transaction of the writer failed with.
        """
        items = self._items(matches)
        if not items:
            return 0
        alerts = self.outbox.prepare(items)
        if self.writer is None:
            self.writer = OutboxWriter(self.outbox, on_stored=self._stored)
        self.writer.put(alerts)
        return len(items)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every alert handed to :meth:`queue_many` is on disk; False when
        ``timeout`` passes first.

        Raises
        ------
        BaseException
            What the writer's transaction failed with (those alerts are not stored).
        """
        return self.writer is None or self.writer.wait(timeout=timeout)

    def _stored(self, count: int) -> None:
        """The writer stored ``count`` new messages: deliver them."""
        self.enqueued += count
        if self.live is not None:
            self.live.wake()

    def _items(self, matches: Sequence[dict]) -> list[tuple[dict, list[Endpoint]]]:
        items = []
        for match in matches:
            targets = self._targets(match)
            if targets is not None:
                items.append((match, targets))
        return items

    def _targets(self, match: dict) -> list[Endpoint] | None:
        """The endpoints ``match`` goes to (``None`` when nobody is notified or the throttle
        holds it back)."""
        decl = _standing(self.program).get(match.get("name", ""))
        if decl is None or not decl.notify:
            return None
        throttle = self.throttles.get(decl.name)
        if throttle is not None:
            key = json.dumps(match.get("key", {}), sort_keys=True, default=str)
            if not throttle.allow(decl.name, key, _time_ms(match.get("end"))):
                self.throttled += 1
                return None
        self.unsent += sum(1 for n in decl.notify if n in self.unset)
        return [self.endpoints[n] for n in decl.notify if n in self.endpoints]

    def reroute(self, program: Program, env: Mapping[str, str] | None = None) -> list[str]:
        """Route by ``program`` from now on (a live change of the running program): its
        webhooks and its declarations' ``notify`` and ``throttle``; a throttle whose interval
        did not change keeps what it let through. Webhooks whose secret is not set are left
        out as with ``unset_ok``; returns the messages of those newly left out.
        """
        unset: dict[str, str] = {}
        endpoints = endpoints_from_program(program, env, unset=unset)
        throttles: dict[str, Throttle] = {}
        for name, decl in _standing(program).items():
            if decl.notify and decl.throttle is not None:
                kept = self.throttles.get(name)
                same = kept is not None and kept.interval_ms == decl.throttle.ms
                throttles[name] = kept if same else Throttle(decl.throttle.ms)
        fresh = [message for name, message in unset.items() if name not in self.unset]
        if endpoints != self.endpoints and self.live is not None:
            self.live.retarget(Dispatcher(self.outbox, list(endpoints.values())))
        self.program, self.endpoints, self.throttles = program, endpoints, throttles
        self.unset = unset
        return fresh

    def start_delivery(self) -> None:
        """Deliver from a background thread from now on, as matches are queued
        (:class:`~cep.alerts.delivery.LiveDelivery`); :meth:`drain` then stops it."""
        if self.live is None:
            self.live = LiveDelivery(Dispatcher(self.outbox, list(self.endpoints.values())))
            self.live.start()

    def drain(self, deadline_s: float) -> DrainResult:
        """Deliver what is due for up to ``deadline_s`` seconds (after storing what was queued
        and stopping the background delivery, whose totals are included)."""
        self.flush()
        if self.live is not None:
            live, self.live = self.live, None
            return live.stop(deadline_s)
        return Dispatcher(self.outbox, list(self.endpoints.values())).drain(deadline_s)

    def close(self) -> None:
        """Store what was queued, then close the outbox."""
        try:
            if self.writer is not None:
                self.writer.close()
        finally:
            self.outbox.close()


def _standing(program: Program) -> dict[str, ast.Node]:
    return {**program.rules, **program.queries, **program.metrics}
