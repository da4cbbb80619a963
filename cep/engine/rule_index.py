"""Which rules an event may start or advance, found per batch column-wise, so that each key runs
only those: the rule index, a swappable strategy with a baseline that offers every event to every
rule reading its stream (the results are the same; only the rules run differ)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import pandas as pd

from cep.engine.dispatch import KeyedRules, KeyTimers, dispatch
from cep.engine.intake import mask_tuples, rule_masks
from cep.events.event import Event
from cep.nfa.compiler import RELEASE_TIME_COLUMN
from cep.nfa.processor import NOT_REGISTERED, KeyState, RuleProcessor
from cep.nfa.touches import rule_rows

__all__ = ["RULE_INDEXES", "NoIndex", "RuleIndex", "StartIndex", "Touches"]


class RuleIndex(Protocol):
    """How a batch's rows are matched to the rules they may touch, and run per key."""

    name: str

    def payloads(
        self,
        stream: str,
        frame: pd.DataFrame,
        groups: Iterable[KeyedRules],
        rules: Mapping[str, Any],
        slot_of: Mapping[str, int],
        width: int,
    ) -> tuple[Sequence[Any], np.ndarray]:
        """Per row some rule must see (their numbers, the second value), what the reorder
        buffer holds beside its event: a per-slot sequence of columnar masks."""
        ...

    def dispatch(
        self,
        groups: Mapping[tuple, KeyedRules],
        released: Sequence[tuple[int, int, tuple[Event, Sequence[Any]]]],
        timers: KeyTimers,
        outputs: list[dict[str, Any]],
        missing_key: Callable[[RuleProcessor, Event], None],
    ) -> None:
        """Run released ``(ts, seq, (event, masks))`` entries through the rules of their keys."""
        ...


class NoIndex:
    """The baseline: each row carries every slot's mask, and every rule reading a row's stream
    is offered the row (the processor skips those whose mask is 0)."""

    name = "none"

    def payloads(self, stream, frame, groups, rules, slot_of, width):
        masks, relevant = rule_masks(stream, frame, groups, rules, slot_of, width)
        rows = np.flatnonzero(relevant)
        if masks is None or len(rows) == 0:
            return [], rows[:0]
        return mask_tuples(masks[rows]), rows

    def dispatch(self, groups, released, timers, outputs, missing_key):
        dispatch(groups, released, timers, outputs, missing_key)


class Touches(Sequence):
    """The rules one row may touch: ``(slot, mask)`` pairs, and the number of slots when it
    arrived. Reads as the per-slot masks of :class:`NoIndex` (0 for slots not named), which is
    how a checkpoint stores it.

    ``advances`` holds apart the masks of the rules the row can only advance (it begins a match
    of none of them, and they need not see every event): these matter only on a key where the
    rule has a partial match, so a key's rules look them up there instead of every row carrying
    them to every key. Rules whose masks agree on such rows share one
    (:meth:`RuleProcessor.advance_class`): ``advances`` maps class -> mask, ``members`` (one
    per batch) class -> the slots of its rules, ``advancing`` names the rule groups they are
    in."""

    __slots__ = ("width", "entries", "advances", "advancing", "members")

    def __init__(self, width: int, entries: tuple[tuple[int, int], ...],
                 advances: dict[int, int] | None = None, advancing: tuple = (),
                 members: Mapping[int, Sequence[int]] | None = None) -> None:
        self.width = width
        self.entries = entries
        self.advances = advances
        self.advancing = advancing
        self.members = members

    def __len__(self) -> int:
        return self.width

    def __getitem__(self, slot):  # type: ignore[override]
        return self._dense()[slot]

    def __iter__(self) -> Iterator[int]:
        return iter(self._dense())

    def _dense(self) -> list[int]:
        dense = [0] * self.width
        if self.advances:
            for cls, mask in self.advances.items():
                for slot in self.members[cls]:
                    dense[slot] = mask
        for slot, mask in self.entries:  # (a rule the row may begin: its whole mask)
            dense[slot] = mask
        return dense

    def __repr__(self) -> str:
        return f"Touches({self.width}, {self.entries!r}, {self.advances!r})"


class StartIndex:
    """Rows matched to rules by their columnar conditions, evaluated once per batch for every
    rule reading the same condition text; each row carries only the rules it may touch.

    A row is handed to a rule when one of the rule's conditions may hold for it (its columnar
    mask is not 0); the processor then runs the rule only when the row may begin a match or
    the rule has partial matches on the key (:meth:`RuleProcessor.run_indexed`). Rules that
    must see every event (strict contiguity, ``prev``) still receive every row of their keys,
    but a scanned one runs only from the first row that may start it or while a run is live.
    """

    name = "starts"

    def payloads(self, stream, frame, groups, rules, slot_of, width):
        n = len(frame)
        shared: dict[tuple, np.ndarray] = {}
        every = False
        # (rows, slots, masks) of the pairs each row carries, and (rows, class, masks) of the
        # classes of rules it only advances; per class the slots of its rules and its groups
        carried: tuple[list, list, list] = ([], [], [])
        apart: tuple[list, list, list] = ([], [], [])
        members: dict[int, list[int]] = {}
        in_groups: dict[int, int] = {}
        advancing: dict[int, tuple[int, KeyedRules]] = {}  # id -> (number, group)
        for group in groups:
            if stream not in group.readers:
                continue
            every = every or stream in group.always
            processor = group.processor
            for index, chosen, mask in rule_rows(processor, stream, frame, shared):
                slot = group.slots[index]
                cls = processor.advance_class(index)
                if cls is not None:
                    start = processor.start_bits_of(index)
                    number = advancing.setdefault(id(group), (len(advancing), group))[0]
                    in_groups[cls] = in_groups.get(cls, 0) | (1 << number)
                    if cls in members:
                        members[cls].append(slot)
                    else:
                        members[cls] = [slot]
                        later = mask & ~np.int64(start)
                        on = later != 0
                        _add(apart, chosen[on], cls, later[on])
                    begins = (mask & np.int64(start)) != 0
                    chosen, mask = chosen[begins], mask[begins]
                    if len(chosen) == 0:
                        continue
                _add(carried, chosen, slot, mask)
        rows, found = _per_row(*carried)
        if any(len(r) for r in apart[0]):
            numbered = sorted(advancing.values(), key=lambda pair: pair[0])
            rows, found = _with_advances(width, rows, found, apart, members, in_groups,
                                         [group for _, group in numbered])
        else:
            found = [Touches(width, pairs) for pairs in found]
        if len(rows) == 0:
            if every:
                return [Touches(width, ())] * n, np.arange(n)
            return [], np.zeros(0, dtype=np.int64)
        if not every:
            return found, rows
        out: list[Touches] = [Touches(width, ())] * n
        for row, touches in zip(rows.tolist(), found, strict=True):
            out[row] = touches
        return out, np.arange(n)

    def dispatch(self, groups, released, timers, outputs, missing_key):
        released = _refined_at_release(groups, released)
        owner: dict[int, tuple[tuple, int, bool]] = {}
        always: dict[str, list[tuple]] = {}
        prepared = {}
        for signature, group in groups.items():
            processor = group.processor
            for index, slot in enumerate(group.slots):
                owner[slot] = (
                    signature, index,
                    must_see_all(processor, index) and index not in processor.scanned,
                )
            for stream in group.always:
                always.setdefault(stream, []).append(signature)
            prepared[signature] = (
                processor.keys_of_event if processor.multi_key else processor.key_of_event,
                processor.multi_key,
            )
        # One group whose slots are its rules' indexes (no rule removed or in another
        # group): a row's (slot, mask) pairs are already its (index, mask) pairs, in order.
        direct = None
        if len(groups) == 1:
            signature, group = next(iter(groups.items()))
            if group.width == len(group.slots):
                direct = signature
        signature_of = {id(group): signature for signature, group in groups.items()}
        work: dict[tuple[tuple, tuple], list] = {}
        for _ts, _seq, (event, masks) in released:
            advances = None
            if type(masks) is Touches:
                entries, width, advances = masks.entries, masks.width, masks.advances
            else:
                entries, width = _dense_entries(masks, event, owner, groups), len(masks)
            per: dict[tuple, Any]
            if direct is not None and width <= len(owner):
                per = {direct: entries} if entries or advances or event.stream in always else {}
                entries = ()
            else:
                per = {}
            for slot, mask in entries:
                found = owner.get(slot)
                if found is None:
                    continue  # the rule was removed since the row arrived
                touches = per.get(found[0])
                if touches is None:
                    per[found[0]] = [(found[1], mask)]
                else:
                    touches.append((found[1], mask))
            for signature in always.get(event.stream, ()):
                if signature not in per:
                    per[signature] = []
            if advances:
                for group in masks.advancing:
                    signature = signature_of.get(id(group))
                    if signature is None:
                        # The group was rebuilt since (rules registered or removed): every
                        # group reading the event's stream may want it.
                        for signature, now in groups.items():
                            if event.stream in now.readers:
                                per.setdefault(signature, [])
                    elif signature not in per:
                        per[signature] = []
            for signature, touches in per.items():
                key_fn, multi = prepared[signature]
                if multi:
                    keys = key_fn(event)
                else:
                    key = key_fn(event)
                    keys = () if key is None else (key,)
                if not keys:
                    missing_key(groups[signature].processor, event)
                    continue
                if len(touches) > 1 and type(touches) is list:
                    touches.sort()
                item = (event, touches, width, advances)
                for key in keys:
                    items = work.get((signature, key))
                    if items is None:
                        work[(signature, key)] = [item]
                    else:
                        items.append(item)
        jobs: dict[tuple, list] = {}
        for (signature, key), items in work.items():
            group = groups[signature]
            state = group.states.get(key)
            if state is None:
                state = group.states[key] = KeyState(busy={})  # a new key: no rule is busy
            jobs.setdefault(signature, []).append((key, state, items))
        for signature, group_jobs in jobs.items():
            group = groups[signature]
            group.processor.run_indexed(group_jobs, outputs, group.slots)
            for key, state, _items in group_jobs:
                timers.update(signature, group, key, state)


def _add(into: tuple[list, list, list], rows: np.ndarray, label: int, masks: np.ndarray) -> None:
    """Append ``(row, label, mask)`` triples (``label`` a slot or a class) to ``into``."""
    into[0].append(rows)
    into[1].append(np.full(len(rows), label, dtype=np.int64))
    into[2].append(masks)


def _per_row(
    rows: list[np.ndarray], slots: list[np.ndarray], masks: list[np.ndarray],
) -> tuple[np.ndarray, list[tuple[tuple[int, int], ...]]]:
    """The distinct rows of some ``(row, slot, mask)`` triples (ascending), and each one's
    ``(slot, mask)`` pairs in the order given."""
    if not rows:
        return np.zeros(0, dtype=np.int64), []
    row_all = np.concatenate(rows)
    order = np.argsort(row_all, kind="stable")
    row_all = row_all[order]
    pairs = list(zip(np.concatenate(slots)[order].tolist(),
                     np.concatenate(masks)[order].tolist(), strict=True))
    cuts = np.flatnonzero(row_all[1:] != row_all[:-1]) + 1
    starts = [0, *cuts.tolist()]
    ends = [*cuts.tolist(), len(pairs)]
    return row_all[starts], [tuple(pairs[lo:hi]) for lo, hi in zip(starts, ends, strict=True)]


def _with_advances(
    width: int, rows: np.ndarray, found: list[tuple[tuple[int, int], ...]],
    apart: tuple[list, list, list], members: dict[int, list[int]], in_groups: dict[int, int],
    groups: list[KeyedRules],
) -> tuple[np.ndarray, list[Touches]]:
    """The rows carrying pairs (``rows``, ``found``) or advances (``apart``: rows, class,
    masks; per class ``members`` its slots and ``in_groups`` its groups as bits of
    ``groups``), ascending, and each one's :class:`Touches`."""
    apart_rows, advances = _per_row(*apart)
    carried = dict(zip(rows.tolist(), found, strict=True))
    extra = dict(zip(apart_rows.tolist(), advances, strict=True))
    named: dict[int, tuple[KeyedRules, ...]] = {}
    every_row = np.union1d(rows, apart_rows)
    out = []
    for row in every_row.tolist():
        pairs = carried.get(row, ())
        more = extra.get(row)
        if more is None:
            out.append(Touches(width, pairs))
            continue
        code = 0
        for cls, _ in more:
            code |= in_groups[cls]
        advancing = named.get(code)
        if advancing is None:
            advancing = named[code] = tuple(g for n, g in enumerate(groups) if (code >> n) & 1)
        out.append(Touches(width, pairs, dict(more), advancing, members))
    return every_row, out


RULE_INDEXES: dict[str, type] = {NoIndex.name: NoIndex, StartIndex.name: StartIndex}
"""The strategies by name (the engine's ``rule_index`` option)."""


def must_see_all(processor: RuleProcessor, index: int) -> bool:
    """Whether rule ``index`` of ``processor`` must be shown rows whose mask is 0."""
    return processor.must_see[index]


def _refined_at_release(
    groups: Mapping[tuple, KeyedRules],
    released: Sequence[tuple[int, int, tuple[Event, Sequence[Any]]]],
) -> Sequence[tuple[int, int, tuple[Event, Sequence[Any]]]]:
    """``released`` with each condition that reads a table decided column-wise now, when the
    tables stand as the rules will read them: its bit cleared in an event's mask where the
    condition's release form (:class:`cep.nfa.compiler.ReleaseCondition`) rules the event
    out, and a rule whose mask becomes 0 no longer offered the event — as if its mask had
    been 0 on arrival. The matches are the same (the predicate would reject the event); what
    is saved is running the event through its key's automaton."""
    deferred: dict[int, tuple[tuple[str, ...], tuple[tuple[int, Any], ...]]] = {}
    for group in groups.values():
        processor = group.processor
        for index, (rule, slot) in enumerate(zip(processor.rules, group.slots, strict=True)):
            pairs = getattr(rule, "at_release", ())  # (another compiler's rules have none)
            if pairs and index not in processor.scanned and not must_see_all(processor, index):
                deferred[slot] = (rule.streams, pairs)
    if not deferred:
        return released
    # Each distinct condition once: the events it is evaluated over (positions in `released`,
    # ascending) and the (row in its frame, position, slot, bit) each result decides.
    tasks: list[tuple[Any, list[int], list[tuple[int, int, int, int]]]] = []
    task_of: dict[tuple, int] = {}
    plan: dict[int, list[tuple[int, int]]] = {}
    for slot, (streams, pairs) in deferred.items():
        steps = plan[slot] = []
        for bit, condition in pairs:
            index = task_of.get((streams, condition.text))
            if index is None:
                index = task_of[(streams, condition.text)] = len(tasks)
                tasks.append((condition, [], []))
            steps.append((bit, index))
    for position, (_ts, _seq, (_event, masks)) in enumerate(released):
        if type(masks) is not Touches:
            continue  # fed on its own or restored: its conditions are evaluated row by row
        for slot, mask in masks.entries:  # (a rule with such conditions has no advances)
            steps = plan.get(slot)
            if steps is None or not mask:
                continue
            for bit, index in steps:
                if (mask >> bit) & 1:
                    _condition, positions, decided = tasks[index]
                    if not positions or positions[-1] != position:
                        positions.append(position)
                    decided.append((len(positions) - 1, position, slot, bit))
    cleared: dict[int, dict[int, int]] = {}
    for condition, positions, decided in tasks:
        if not positions:
            continue
        events = [released[position][2][0] for position in positions]
        frame = pd.DataFrame(
            {name: pd.Series([e.fields.get(name) for e in events], dtype=object)
             for name in condition.reads}
        )
        frame[RELEASE_TIME_COLUMN] = np.fromiter((e.ts for e in events), dtype=np.int64,
                                                 count=len(events))
        fails = ~np.asarray(condition.evaluate(frame), dtype=bool)
        if not fails.any():
            continue
        for row, position, slot, bit in decided:
            if fails[row]:
                bits = cleared.get(position)
                if bits is None:
                    cleared[position] = {slot: 1 << bit}
                else:
                    bits[slot] = bits.get(slot, 0) | (1 << bit)
    if not cleared:
        return released
    always = set().union(*(group.always for group in groups.values()))
    out = []
    for position, entry in enumerate(released):
        bits = cleared.get(position)
        if bits is None:
            out.append(entry)
            continue
        ts, seq, (event, masks) = entry
        kept = tuple(
            (slot, mask & ~bits[slot] if slot in bits else mask)
            for slot, mask in masks.entries
        )
        # a rule whose mask is now 0 is ruled out: as if its mask had been 0 on arrival
        kept = tuple(pair for pair in kept if pair[1] or pair[0] not in bits)
        if kept or masks.advances or event.stream in always:
            out.append((ts, seq, (event, Touches(masks.width, kept, masks.advances,
                                                 masks.advancing, masks.members))))
    return out


def _dense_entries(
    masks: Sequence[Any], event: Event, owner: Mapping[int, tuple[tuple, int, bool]],
    groups: Mapping[tuple, KeyedRules],
) -> list[tuple[int, Any]]:
    """The ``(slot, mask)`` pairs a per-slot mask sequence (an event fed on its own, or one
    restored from a checkpoint) stands for."""
    out = []
    for slot, mask in enumerate(masks):
        if mask is NOT_REGISTERED:
            continue
        found = owner.get(slot)
        if found is None:
            continue
        signature, index, needs_all = found
        if event.stream not in groups[signature].processor.rules[index].streams:
            continue
        if mask is None or mask != 0 or needs_all:
            out.append((slot, mask))
    return out
