"""Webhook alert delivery: matches are stored in a durable outbox and POSTed to endpoints,
signed per Standard Webhooks, retried with backoff, and never lost or duplicated at receivers.

Typical use::

    outbox = Outbox("alerts.sqlite")
    outbox.enqueue(match, [endpoint])          # durable before the match is acknowledged
    # or, without waiting for the disk: OutboxWriter(outbox).put(outbox.prepare(...)), and
    # wait() before the input that produced the matches is acknowledged
    Dispatcher(outbox, [endpoint]).drain(deadline_s=30.0)
"""

from __future__ import annotations

from .breaker import BreakerState, CircuitBreaker
from .clock import Clock, ManualClock, SystemClock
from .dispatcher import Dispatcher, DrainResult, ResponseHook
from .endpoint import Endpoint
from .envelope import MATCH_EVENT_TYPE, checked_match_id, envelope_body
from .errors import (
    AlertConfigError,
    AlertError,
    InvalidMatchError,
    OutboxError,
    SignatureError,
    ThrottleStateError,
    TransportError,
)
from .masking import mask_secret, mask_url
from .outbox import (
    AttemptRecord,
    DeadLetter,
    DeliveryState,
    EndpointStatus,
    Message,
    Outbox,
    Outcome,
    QueuedAlert,
    replay,
    status,
)
from .receiver import AlertCallback, ReceivedAlert, WebhookReceiver
from .retry import DEFAULT_SCHEDULE, RetryPolicy, parse_retry_after
from .routing import DEFAULT_OUTBOX, AlertSink, endpoints_from_program
from .signing import decode_secret, new_secret, sign, verify
from .throttle import Throttle
from .transport import HttpResponse, HttpTransport, Transport
from .writer import OutboxWriter

__all__ = [
    "DEFAULT_OUTBOX",
    "DEFAULT_SCHEDULE",
    "AlertSink",
    "endpoints_from_program",
    "MATCH_EVENT_TYPE",
    "AlertCallback",
    "AlertConfigError",
    "AlertError",
    "AttemptRecord",
    "BreakerState",
    "CircuitBreaker",
    "Clock",
    "DeadLetter",
    "DeliveryState",
    "Dispatcher",
    "DrainResult",
    "Endpoint",
    "EndpointStatus",
    "HttpResponse",
    "HttpTransport",
    "InvalidMatchError",
    "ManualClock",
    "Message",
    "Outbox",
    "OutboxError",
    "OutboxWriter",
    "Outcome",
    "QueuedAlert",
    "ReceivedAlert",
    "ResponseHook",
    "RetryPolicy",
    "SignatureError",
    "SystemClock",
    "Throttle",
    "ThrottleStateError",
    "Transport",
    "TransportError",
    "WebhookReceiver",
    "decode_secret",
    "envelope_body",
    "mask_secret",
    "mask_url",
    "checked_match_id",
    "new_secret",
    "parse_retry_after",
    "replay",
    "sign",
    "status",
    "verify",
]
