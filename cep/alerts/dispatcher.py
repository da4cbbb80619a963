"""Delivery of outbox messages: signing, retries with jitter, circuit breakers, bounded workers.

Each endpoint receives its messages strictly in enqueue order, one request at a time: only
an endpoint's oldest pending message is ever sent, so a retrying message holds back the ones
behind it and a recovered endpoint drains its backlog in order. Endpoints are served in
parallel by a bounded worker pool, so a slow endpoint delays nobody else.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass

from .breaker import CircuitBreaker
from .clock import Clock, SystemClock
from .endpoint import Endpoint
from .errors import AlertConfigError, TransportError
from .masking import mask_secret
from .outbox import Message, Outbox, Outcome
from .retry import RetryPolicy, parse_retry_after
from .signing import sign
from .transport import HttpResponse, HttpTransport, Transport

__all__ = ["DrainResult", "Dispatcher", "ResponseHook"]

logger = logging.getLogger(__name__)

USER_AGENT = "vigil-alerts/1"
# Transient by definition, although 4xx: retried instead of dead-lettered.
_RETRYABLE_4XX = frozenset({408, 425, 429})
_ERROR_SNIPPET = 200

ResponseHook = Callable[[Message, HttpResponse], None]


@dataclass(frozen=True)
class DrainResult:
    """What one :meth:`Dispatcher.drain` did, and what it left for the next run.

    Attributes
    ----------
    attempts : int
        Requests made.
    delivered, retried, failed, disabled : int
        Attempts by outcome: acknowledged with 2xx; scheduled again; dead-lettered; answered
        410 (which parks the endpoint's messages).
    pending : int
        Messages still waiting, in the outbox, for a later run.
    next_attempt_at : float or None
        Earliest unix time one of them is due, if any endpoint can take it.
    deadline_reached : bool
        True if the deadline cut the drain short; False if nothing was due before it.
    unknown_endpoints : tuple of str
        Endpoints with pending messages but no configuration in this dispatcher.
    """

    attempts: int = 0
    delivered: int = 0
    retried: int = 0
    failed: int = 0
    disabled: int = 0
    pending: int = 0
    next_attempt_at: float | None = None
    deadline_reached: bool = False
    unknown_endpoints: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Attempt:
    """A finished request, handed from a worker thread back to the coordinating thread."""

    message: Message
    endpoint: Endpoint
    attempted_at: float
    latency_ms: float
    response: HttpResponse | None
    error: str | None


class Dispatcher:
    """Delivers an outbox's messages to their endpoints.

    Parameters
    ----------
    outbox : Outbox
        Where messages and their state live.
    endpoints : iterable of Endpoint
        Configuration of the endpoints to deliver to, by name. Messages for endpoints not
        listed stay pending and are reported in :attr:`DrainResult.unknown_endpoints`.
    policy : RetryPolicy, optional
        Retry schedule and jitter; defaults to ``RetryPolicy()``.
    clock : Clock, optional
        Time source for schedules, timestamps and waiting; defaults to the system clock.
    transport : Transport, optional
        Sends the requests; defaults to :class:`HttpTransport`.
    rng : random.Random, optional
        Jitter source; pass a seeded one for reproducible schedules.
    max_workers : int
        Most requests in flight at once, over all endpoints.
    breaker_threshold : int
        Consecutive failures after which an endpoint's circuit breaker opens.
    breaker_cooldown_s : float
        How long an open breaker waits before letting one probe through.
    on_response : callable, optional
        Called in the worker thread with ``(message, response)`` as soon as a response
        arrives, before the outcome is recorded (an instrumentation and fault-injection hook).
        An exception it raises ends :meth:`drain`; attempts not yet recorded are sent again
        by a later drain, which receivers deduplicate.

    Examples
    --------
    A real receiver on a free local port, verifying each signature:

    >>> import os, tempfile
    >>> from cep.alerts import Endpoint, Outbox, WebhookReceiver, new_secret
    >>> secret = new_secret()
    >>> with WebhookReceiver(secret) as receiver:
    ...     ops = Endpoint("ops", receiver.url, (secret,))
    ...     outbox = Outbox(os.path.join(tempfile.mkdtemp(), "outbox.sqlite"))
    ...     _ = outbox.enqueue({"match_id": "m1", "name": "probe"}, [ops])
    ...     result = Dispatcher(outbox, [ops]).drain(deadline_s=10.0)
    ...     outbox.close()
    >>> result.delivered, result.pending, receiver.webhook_ids
    (1, 0, ['m1'])
    """

    def __init__(
        self,
        outbox: Outbox,
        endpoints: Iterable[Endpoint],
        *,
        policy: RetryPolicy | None = None,
        clock: Clock | None = None,
        transport: Transport | None = None,
        rng: random.Random | None = None,
        max_workers: int = 8,
        breaker_threshold: int = 5,
        breaker_cooldown_s: float = 60.0,
        on_response: ResponseHook | None = None,
    ) -> None:
        self._outbox = outbox
        self._endpoints: dict[str, Endpoint] = {}
        for endpoint in endpoints:
            if not isinstance(endpoint, Endpoint):
                raise AlertConfigError(f"expected Endpoint, got {type(endpoint).__name__}")
            if endpoint.name in self._endpoints:
                raise AlertConfigError(f"endpoint {endpoint.name!r} is configured twice")
            self._endpoints[endpoint.name] = endpoint
        if max_workers < 1:
            raise AlertConfigError(f"max_workers must be >= 1, got {max_workers}")
        self._policy = policy or RetryPolicy()
        self._clock = clock or SystemClock()
        self._own_transport = transport is None
        self._transport = transport or HttpTransport()
        self._pool: ThreadPoolExecutor | None = None
        self._rng = rng or random.Random()
        self._max_workers = max_workers
        self._breakers = {
            name: CircuitBreaker(threshold=breaker_threshold, cooldown_s=breaker_cooldown_s)
            for name in self._endpoints
        }
        self._on_response = on_response

    @property
    def breakers(self) -> Mapping[str, CircuitBreaker]:
        """Each configured endpoint's circuit breaker (in memory; reset on restart)."""
        return self._breakers

    def drain(self, deadline_s: float, *, wake: threading.Event | None = None) -> DrainResult:
        """Deliver due messages until none is due before the deadline, or it passes.

        Waits (on the dispatcher's clock) for retries that fall due before the deadline.
        Requests in flight when the deadline passes are completed and recorded. Whatever is
        still pending stays in the outbox for the next run. The worker threads and the
        connections kept open stay for the next drain, until :meth:`close`.

        Parameters
        ----------
        deadline_s : float
            Seconds, on the dispatcher's clock, after which no new request is started.
        wake : threading.Event, optional
            Set by whoever stores a message while the drain runs: a wait for a retry or for a
            request in flight ends at once, and the new message is sent if its endpoint is
            free (a slow or retrying endpoint then holds back nobody else's new messages).
            The waits are then in real time, whatever the clock.
        """
        if not (deadline_s >= 0 and math.isfinite(deadline_s)):
            raise AlertConfigError(f"deadline_s must be finite and >= 0, got {deadline_s}")
        deadline = self._clock.now() + deadline_s
        tally = {outcome: 0 for outcome in Outcome}
        unknown: set[str] = set()
        in_flight: dict[str, Future[_Attempt]] = {}
        deadline_reached = False
        if self._pool is None:  # kept for the next drain: a live run drains at every alert
            self._pool = ThreadPoolExecutor(self._max_workers, thread_name_prefix="vigil-alerts")
        pool = self._pool
        try:
            while True:
                if wake is not None:
                    wake.clear()  # before the outbox is read: a message stored after wakes
                for name, future in list(in_flight.items()):
                    if future.done():
                        del in_flight[name]
                        tally[self._settle(future.result())] += 1
                now = self._clock.now()
                next_due = math.inf
                if now < deadline:
                    for head in self._outbox.heads():
                        if head.endpoint in in_flight:
                            continue
                        if head.endpoint not in self._endpoints:
                            unknown.add(head.endpoint)
                            continue
                        breaker = self._breakers[head.endpoint]
                        ready_at = max(self._due_at(head), breaker.ready_at())
                        if ready_at > now:
                            next_due = min(next_due, ready_at)
                        elif len(in_flight) < self._max_workers and breaker.try_acquire(now):
                            endpoint = self._endpoints[head.endpoint]
                            future = pool.submit(self._send, head, endpoint)
                            if wake is not None:
                                future.add_done_callback(lambda _: wake.set())
                            in_flight[head.endpoint] = future
                if not in_flight:
                    if now >= deadline:
                        deadline_reached = self._has_due_work(now)
                        break
                    if next_due >= deadline:
                        break
                    if wake is None:
                        self._clock.sleep(next_due - now)
                    else:
                        wake.wait(next_due - now)
                    continue
                timeout = None if next_due == math.inf else max(0.0, min(next_due, deadline) - now)
                if wake is None:
                    wait(list(in_flight.values()), timeout=timeout, return_when=FIRST_COMPLETED)
                else:  # a finished request sets it too
                    wake.wait(timeout)
        except BaseException:
            # Nothing in flight outlives the drain: a later one may send those messages again.
            wait(list(in_flight.values()))
            raise
        return self._result(tally, unknown, deadline_reached)

    def close(self) -> None:
        """Stop the worker threads and close the connections kept open (a later
        :meth:`drain` starts them again)."""
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)
        if self._own_transport and isinstance(self._transport, HttpTransport):
            self._transport.close()

    def _has_due_work(self, now: float) -> bool:
        return any(
            max(self._due_at(head), self._breakers[head.endpoint].ready_at()) <= now
            for head in self._outbox.heads()
            if head.endpoint in self._endpoints
        )

    def _due_at(self, message: Message) -> float:
        scheduled = message.next_attempt_at
        base = message.created_at if scheduled is None else scheduled
        # The first delay ("immediately" by default) is applied unjittered, at read time.
        return base + self._policy.schedule[0] if message.attempts == 0 else base

    def _send(self, message: Message, endpoint: Endpoint) -> _Attempt:
        attempted_at = self._clock.now()
        timestamp = int(attempted_at)
        headers = {
            "Content-Type": "application/json",
            "User-Agent": USER_AGENT,
            "webhook-id": message.msg_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": sign(message.msg_id, timestamp, message.body, endpoint.secrets),
        }
        started = time.perf_counter()
        try:
            response = self._transport.post(endpoint.url, message.body, headers, endpoint.timeout_s)
        except TransportError as exc:
            latency_ms = (time.perf_counter() - started) * 1000.0
            return _Attempt(message, endpoint, attempted_at, latency_ms, None, str(exc))
        latency_ms = (time.perf_counter() - started) * 1000.0
        if self._on_response is not None:
            self._on_response(message, response)
        return _Attempt(message, endpoint, attempted_at, latency_ms, response, None)

    def _settle(self, attempt: _Attempt) -> Outcome:
        message, endpoint, response = attempt.message, attempt.endpoint, attempt.response
        breaker = self._breakers[endpoint.name]
        now = self._clock.now()
        status = response.status if response is not None else None
        error = attempt.error
        if response is not None and not 200 <= response.status < 300:
            error = _describe(response)
        error = _scrub(error, endpoint)
        next_attempt_at: float | None = None
        reason: str | None = None
        if status is not None and 200 <= status < 300:
            outcome = Outcome.DELIVERED
            breaker.record_success()
        elif status == 410:
            outcome = Outcome.DISABLED
            reason = "endpoint answered 410 Gone; disabled until re-enabled"
            breaker.record_success()
        elif status is not None and 400 <= status < 500 and status not in _RETRYABLE_4XX:
            outcome = Outcome.FAILED
            reason = f"permanent failure: {error}"
            breaker.record_success()
        else:
            breaker.record_failure(now)
            made = message.attempts + 1
            delay = self._policy.delay_after(made, self._rng)
            if delay is None:
                outcome = Outcome.FAILED
                reason = f"retries exhausted after {made} attempts; last: {error}"
            else:
                outcome = Outcome.RETRY
                headers = response.headers if response is not None else {}
                retry_after = parse_retry_after(headers.get("retry-after"), now)
                if retry_after is not None:
                    delay = max(delay, min(retry_after, self._policy.max_retry_after_s))
                next_attempt_at = now + delay
        self._outbox.record_attempt(
            message,
            url=endpoint.masked_url,
            attempted_at=attempt.attempted_at,
            status=status,
            error=error,
            latency_ms=attempt.latency_ms,
            outcome=outcome,
            next_attempt_at=next_attempt_at,
            reason=reason,
        )
        self._log(attempt, outcome, status, error, next_attempt_at, reason)
        return outcome

    def _log(
        self,
        attempt: _Attempt,
        outcome: Outcome,
        status: int | None,
        error: str | None,
        next_attempt_at: float | None,
        reason: str | None,
    ) -> None:
        level = logging.INFO if outcome is Outcome.DELIVERED else logging.WARNING
        logger.log(
            level,
            "webhook %s to %s (%s) attempt %d: %s, %s in %.0f ms%s%s",
            attempt.message.msg_id,
            attempt.endpoint.name,
            attempt.endpoint.masked_url,
            attempt.message.attempts + 1,
            outcome.value,
            f"HTTP {status}" if status is not None else error,
            attempt.latency_ms,
            "" if next_attempt_at is None else f", next attempt at {next_attempt_at:.0f}",
            "" if reason is None else f" ({reason})",
        )

    def _result(
        self, tally: Mapping[Outcome, int], unknown: set[str], deadline_reached: bool
    ) -> DrainResult:
        next_attempt_at = None
        for head in self._outbox.heads():
            if head.endpoint in self._endpoints:
                ready = max(self._due_at(head), self._breakers[head.endpoint].ready_at())
                next_attempt_at = ready if next_attempt_at is None else min(next_attempt_at, ready)
            else:
                unknown.add(head.endpoint)
        return DrainResult(
            attempts=sum(tally.values()),
            delivered=tally[Outcome.DELIVERED],
            retried=tally[Outcome.RETRY],
            failed=tally[Outcome.FAILED],
            disabled=tally[Outcome.DISABLED],
            pending=self._outbox.pending_count(),
            next_attempt_at=next_attempt_at,
            deadline_reached=deadline_reached,
            unknown_endpoints=tuple(sorted(unknown)),
        )


def _describe(response: HttpResponse) -> str:
    text = response.body[:_ERROR_SNIPPET].decode("utf-8", "replace")
    text = "".join(ch if ch.isprintable() else " " for ch in text).strip()
    return f"HTTP {response.status}" + (f": {text}" if text else "")


def _scrub(text: str | None, endpoint: Endpoint) -> str | None:
    """Mask anything secret a receiver might echo back into an error message."""
    if text is None:
        return None
    for secret in endpoint.secrets:
        text = text.replace(secret, mask_secret(secret))
        text = text.replace(secret.removeprefix("whsec_"), "***")
    return text.replace(endpoint.url, endpoint.masked_url)
