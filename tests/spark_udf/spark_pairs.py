"""A small but real KeyedProcessor for the operator tests: "a then b within T" per key, and the
absence "a without b within T", fired by the watermark (a timer) — with a reorder buffer, so its
results do not depend on how a key's events are split into calls."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from cep.events.keyed import ProcessResult
from query_lang.timestamps import format_iso_ms as iso_utc


def _match(name: str, key: tuple, events: dict[str, list[int]], start: int, end: int) -> dict:
    ident = json.dumps([name, list(key), events], sort_keys=True)
    return {
        "kind": "rule",
        "name": name,
        "match_id": hashlib.sha256(ident.encode()).hexdigest()[:32],
        "key": {"k": key[0]},
        "events": events,
        "start": iso_utc(start),
        "end": iso_utc(end),
    }


class PairProcessor:
    """``pair``: an ``a`` followed by a ``b`` of the same key within ``within_ms``;
    ``no_b``: an ``a`` with no ``b`` within ``within_ms`` (emitted once the watermark passes).

    Events are ``{"stream": "ev", "k": str, "ts": int ms, "kind": str, "_seq": int}``; they are
    buffered until the watermark reaches them, then consumed in ``(ts, _seq)`` order.
    """

    def __init__(self, within_ms: int) -> None:
        self.within_ms = within_ms
        self.calls = 0

    def key_of(self, event: Mapping[str, Any]) -> tuple | None:
        k = event.get("k")
        return None if k is None else (k,)

    def wants(self, stream: str) -> bool:
        return stream == "ev"

    def process(
        self,
        key: tuple,
        state: bytes | None,
        events: Sequence[Mapping[str, Any]],
        watermark_ms: int | None,
    ) -> ProcessResult:
        self.calls += 1
        st = json.loads(state) if state else {"buffer": [], "pending": []}
        buffer = st["buffer"] + [[int(e["ts"]), int(e["_seq"]), e.get("kind")] for e in events]
        buffer.sort(key=lambda x: (x[0], x[1]))
        wm = watermark_ms if watermark_ms is not None else -(2**63)
        pending = st["pending"]
        outputs: list[dict] = []
        released = [e for e in buffer if e[0] <= wm]
        st["buffer"] = [e for e in buffer if e[0] > wm]
        for ts, seq, kind in released:
            self._expire(key, pending, ts - 1, outputs)
            if kind == "b":
                for a_ts, a_seq in pending:
                    outputs.append(
                        _match("pair", key, {"a": [a_seq], "b": [seq]}, a_ts, ts)
                    )
                pending.clear()
            elif kind == "a":
                pending.append([ts, seq])
        self._expire(key, pending, wm, outputs)
        st["pending"] = pending
        timers = [e[0] for e in st["buffer"][:1]] + [a[0] + self.within_ms for a in pending[:1]]
        empty = not st["buffer"] and not pending
        return ProcessResult(
            state=None if empty else json.dumps(st).encode(),
            outputs=outputs,
            next_timer_ms=[min(timers)] if timers else [],
        )

    def _expire(self, key: tuple, pending: list, until: int, outputs: list[dict]) -> None:
        """Report the pending ``a`` events whose window ended at or before ``until``."""
        while pending and pending[0][0] + self.within_ms <= until:
            a_ts, a_seq = pending.pop(0)
            outputs.append(_match("no_b", key, {"a": [a_seq]}, a_ts, a_ts + self.within_ms))

    def on_timer(
        self, key: tuple, state: bytes | None, timer_ms: int, watermark_ms: int
    ) -> ProcessResult:
        return self.process(key, state, (), watermark_ms)
