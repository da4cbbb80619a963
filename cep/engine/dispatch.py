"""Released events to the rules of each partition key: the rules grouped by key definition
(:class:`KeyedRules`) with each key's state, and the timers that wake a key (:class:`KeyTimers`).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cep.events.event import Event
from cep.nfa.processor import NOT_REGISTERED, KeyState, RuleProcessor, must_see_every_event

__all__ = ["KeyTimers", "KeyedRules", "dispatch", "fire_due"]


@dataclass
class KeyedRules:
    """Rules that share a key definition, their processor and the live state of each key."""

    processor: RuleProcessor
    slots: tuple[int, ...]
    states: dict[tuple, KeyState] = field(default_factory=dict)
    # stream -> (slot, needs_every_event) of the rules reading it, for a quick relevance test
    readers: dict[str, tuple[tuple[int, bool], ...]] = field(default_factory=dict)
    # len(masks) for which an event's masks are already aligned with the processor's rules
    # (the group's slots are 0..n-1), -1 when they never are
    width: int = -1
    # streams some rule of the group must see every event of
    always: frozenset[str] = frozenset()

    @classmethod
    def of(
        cls, processor: RuleProcessor, slots: tuple[int, ...], states: dict[tuple, KeyState]
    ) -> KeyedRules:
        """The group of ``processor``'s rules, registered in engine slots ``slots``."""
        readers: dict[str, list[tuple[int, bool]]] = {}
        for rule, slot in zip(processor.rules, slots, strict=True):
            for stream in rule.streams:
                readers.setdefault(stream, []).append((slot, must_see_every_event(rule)))
        return cls(
            processor=processor,
            slots=slots,
            states=states,
            readers={s: tuple(v) for s, v in readers.items()},
            width=len(slots) if slots == tuple(range(len(slots))) else -1,
            always=frozenset(s for s, rs in readers.items() if any(needs for _, needs in rs)),
        )

    def relevant(self, event: Event, masks: tuple) -> bool:
        """Whether some rule of the group may advance on ``event`` (``masks``: per slot)."""
        readers = self.readers.get(event.stream)
        if not readers:
            return False
        if event.stream in self.always:
            return True
        size = len(masks)
        for slot, needs in readers:
            if slot < size and (needs or masks[slot] != 0):
                return True
        return False


class KeyTimers:
    """When each key must be woken: one live timer per (group, key) at its earliest deadline."""

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, tuple, tuple]] = []
        self._scheduled: dict[tuple[tuple, tuple], int] = {}
        self._seq = 0

    def update(self, signature: tuple, group: KeyedRules, key: tuple, state: KeyState) -> None:
        """After ``state`` changed: drop it when empty, else (re)schedule its next timer."""
        if state.is_empty:
            del group.states[key]
            self._scheduled.pop((signature, key), None)
            return
        due = state.next_timer_ms()
        if due is None:
            return
        known = self._scheduled.get((signature, key))
        if known is None or due < known:
            self._scheduled[(signature, key)] = due
            self._seq += 1
            heapq.heappush(self._heap, (due, self._seq, signature, key))

    def live(self) -> list[tuple[int, tuple, tuple]]:
        """``(due, signature, key)`` of every live timer, in the order they would fire."""
        out = []
        seen: set[tuple[tuple, tuple]] = set()
        # Heap entries whose key was rescheduled earlier or fired since are dead: skipped.
        for due, _, signature, key in sorted(self._heap, key=lambda entry: entry[:2]):
            ident = (signature, key)
            if ident not in seen and self._scheduled.get(ident) == due:
                seen.add(ident)
                out.append((due, signature, key))
        return out

    def restore(self, timers: list[tuple[int, tuple, tuple]]) -> None:
        """Replace every timer by ``(due, signature, key)`` ones (from :meth:`live`), to fire
        in that order; a key listed twice keeps its first."""
        self.clear()
        for due, signature, key in timers:
            if (signature, key) not in self._scheduled:
                self._scheduled[(signature, key)] = due
                self._seq += 1
                self._heap.append((due, self._seq, signature, key))
        heapq.heapify(self._heap)

    def forget(self, signature: tuple, key: tuple) -> None:
        self._scheduled.pop((signature, key), None)

    def clear(self) -> None:
        self._heap.clear()
        self._scheduled.clear()

    def due(self, watermark: int) -> Iterator[tuple[tuple, tuple]]:
        """``(signature, key)`` of the live timers at or below ``watermark``, in time order;
        each is unscheduled as it is yielded."""
        heap = self._heap
        if not heap or heap[0][0] > watermark:
            return
        popped = []
        while heap and heap[0][0] <= watermark:
            popped.append(heapq.heappop(heap))
        for timer_ms, _, signature, key in popped:
            if self._scheduled.get((signature, key)) != timer_ms:
                continue
            del self._scheduled[(signature, key)]
            yield signature, key


def dispatch(
    groups: Mapping[tuple, KeyedRules],
    released: Sequence[tuple[int, int, tuple[Event, tuple]]],
    timers: KeyTimers,
    outputs: list[dict[str, Any]],
    missing_key: Callable[[RuleProcessor, Event], None],
) -> None:
    """Run released ``(ts, seq, (event, masks))`` entries through the rules of their keys.

    Events are grouped per key (keeping their order) so that each key's rules run once per
    release; keys are independent, so this changes no result. An event without a key goes to
    ``missing_key``.
    """
    work: dict[tuple[tuple, tuple], list] = {}
    prepared = [
        (
            signature,
            group,
            group.always,
            group.width,
            group.processor.keys_of_event
            if group.processor.multi_key
            else group.processor.key_of_event,
            group.processor.multi_key,
        )
        for signature, group in groups.items()
    ]
    for _ts, _seq, (event, event_masks) in released:
        for signature, group, always, width, key_fn, multi in prepared:
            if event.stream not in always and not group.relevant(event, event_masks):
                continue
            # Each group reads the event's engine-wide masks through its own slots.
            masks = event_masks if len(event_masks) == width else _aligned(event_masks, group.slots)
            if multi:
                keys = key_fn(event)
            else:
                key = key_fn(event)
                keys = () if key is None else (key,)
            if not keys:
                missing_key(group.processor, event)
                continue
            for key in keys:
                items = work.get((signature, key))
                if items is None:
                    work[(signature, key)] = items = []
                items.append((event, masks))
    jobs: dict[tuple, list[tuple[tuple, KeyState, list]]] = {}
    for (signature, key), items in work.items():
        group = groups[signature]
        state = group.states.get(key)
        if state is None:
            state = group.states[key] = KeyState()
        jobs.setdefault(signature, []).append((key, state, items))
    for signature, group_jobs in jobs.items():
        group = groups[signature]
        group.processor.run_batch(group_jobs, outputs)
        for key, state, _items in group_jobs:
            timers.update(signature, group, key, state)


def fire_due(
    groups: Mapping[tuple, KeyedRules],
    timers: KeyTimers,
    watermark: int,
    outputs: list[dict[str, Any]],
) -> None:
    """Fire the timers of the keys whose next deadline the watermark reached."""
    for signature, key in timers.due(watermark):
        group = groups.get(signature)
        state = group.states.get(key) if group is not None else None
        if state is None:
            continue
        group.processor.fire_timers(state, watermark, outputs)
        timers.update(signature, group, key, state)


def _aligned(masks: tuple, slots: tuple[int, ...]) -> tuple:
    """Per rule of a group, its mask for the event; rules registered after the event arrived
    get :data:`NOT_REGISTERED` and do not see it."""
    size = len(masks)
    return tuple(masks[s] if s < size else NOT_REGISTERED for s in slots)
