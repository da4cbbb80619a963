"""Alerts of ``vigil serve``: the matches of rules, queries and metrics with ``notify`` go to
the durable outbox in the state directory, and a background thread delivers them as they come
(:class:`cep.alerts.LiveDelivery`). The routing follows each registry version: a new
``notify`` or ``throttle`` takes effect with it, and a changed ``webhook`` restarts delivery
with the new endpoints.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

from cep.alerts import (
    AlertSink,
    Dispatcher,
    Endpoint,
    Outbox,
    Throttle,
    endpoints_from_program,
)
from cep.alerts.delivery import LiveDelivery
from query_lang import Program, ast

__all__ = ["ServiceAlerts"]

log = logging.getLogger("vigil.serve")


class ServiceAlerts:
    """The outbox at ``state_dir/outbox.sqlite`` and the routing of the program in force.

    Parameters
    ----------
    env:
        Where webhook secrets (``secret env NAME``) are read (default: the environment).
    outbox:
        Another outbox's path (a Spark job's, which it delivers itself: this one only shows
        it and replays into it, as long as :meth:`update` is not called).
    """

    FILENAME = "outbox.sqlite"

    def __init__(self, state_dir: str, env: Mapping[str, str] | None = None, *,
                 outbox: str | None = None) -> None:
        self.outbox = Outbox(outbox or os.path.join(state_dir, self.FILENAME))
        self._env = env
        self._sink: AlertSink | None = None
        self._dispatcher: Dispatcher | None = None
        self._live: LiveDelivery | None = None
        self._notifying: frozenset[str] = frozenset()

    def update(self, program: Program) -> None:
        """Route by ``program`` from now on."""
        standing = {**program.rules, **program.queries, **program.metrics}
        notifying = {name: d for name, d in standing.items() if d.notify}
        # The sink looks a match's declaration up in its program on every submit: give it only
        # the declarations alerts need, not the thousands of standing queries.
        routing = Program([ast.Module((*program.webhooks.values(), *notifying.values()))])
        unset: dict[str, str] = {}
        endpoints = endpoints_from_program(routing, self._env, unset=unset)
        for message in unset.values():
            log.warning("%s: its alerts will not be delivered", message)
        old = self._sink
        if old is None or old.endpoints != endpoints:
            self._restart_delivery(list(endpoints.values()))
        throttles = {}
        for name, decl in notifying.items():
            if decl.throttle is None:
                continue
            kept = old.throttles.get(name) if old is not None else None
            same = kept is not None and _throttle_ms(old, name) == decl.throttle.ms
            throttles[name] = kept if same else Throttle(decl.throttle.ms)
        self._sink = AlertSink(routing, self.outbox, endpoints, throttles, unset=unset,
                               live=self._live)
        if old is not None:
            self._sink.enqueued, self._sink.throttled = old.enqueued, old.throttled
            self._sink.unsent = old.unsent
        self._notifying = frozenset(notifying)

    def _restart_delivery(self, endpoints: list[Endpoint]) -> None:
        if self._live is not None:
            self._live.stop(0.0)
        self._dispatcher = Dispatcher(self.outbox, endpoints)
        self._live = LiveDelivery(self._dispatcher)
        self._live.start()

    def submit(self, matches: list[dict[str, Any]]) -> None:
        """Queue the alerts of ``matches`` (durably, before returning)."""
        if self._sink is None or not self._notifying:
            return
        self._sink.submit_many([m for m in matches if m.get("name") in self._notifying])

    def status(self) -> dict[str, Any]:
        """Per endpoint: messages pending, delivered, failed, disabled; the breaker's state;
        whether its secret is missing. URLs are masked; secrets are never part of it."""
        breakers = self._dispatcher.breakers if self._dispatcher is not None else {}
        sink = self._sink
        endpoints = []
        for name, status in self.outbox.status().items():
            breaker = breakers.get(name)
            endpoints.append({
                "endpoint": name,
                "url": status.url,
                "pending": status.pending,
                "delivered": status.delivered,
                "failed": status.failed,
                "disabled": status.disabled,
                "duplicates": status.duplicates,
                "endpoint_disabled": status.endpoint_disabled,
                "breaker": breaker.state.value if breaker is not None else None,
            })
        return {
            "endpoints": endpoints,
            "enqueued": sink.enqueued if sink else 0,
            "throttled": sink.throttled if sink else 0,
            "unsent": sink.unsent if sink else 0,
            "secrets_not_set": sorted(sink.unset) if sink else [],
        }

    def close(self, deadline_s: float = 2.0) -> None:
        """Stop delivering (after up to ``deadline_s`` seconds of what is due) and close."""
        if self._live is not None:
            try:
                self._live.stop(deadline_s)
            except Exception as exc:  # reported, the shutdown goes on
                log.warning("alert delivery ended with an error: %s", exc)
            self._live = None
        self.outbox.close()


def _throttle_ms(sink: AlertSink, name: str) -> int | None:
    """The throttle interval a sink's program gives ``name``."""
    decl = {**sink.program.rules, **sink.program.queries, **sink.program.metrics}.get(name)
    return decl.throttle.ms if decl is not None and decl.throttle is not None else None
