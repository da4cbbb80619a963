"""Hypothesis strategies for the event-path fuzz suites (embedded and Spark): input files of
good events with bad lines mixed in — deep, wide, non-finite, not UTF-8, of the wrong types,
huge, far in time, random bytes — over one program with a rule, queries and a metric.

Good events carry an ``id``, which no mutation touches: an event's id, hence its matches' ids,
do not depend on its position, so a run without the dead-lettered lines must report exactly
the same matches.
"""

from __future__ import annotations

import json
import os

from hypothesis import strategies as st

from cep.events.limits import MAX_EVENT_BYTES, MAX_EVENT_DEPTH

PROGRAM = """
stream txn (id string, card_id string, amount float, n int, ok bool, tags list<string>,
            title text, ts timestamp) time ts unit ms lateness 5s

rule probe_then_big from txn by card_id
  pattern a b define a as amount < 10, b as amount > 500 within 1m

query alpha from txn match title:alpha
query tagged from txn match tags:x OR extra:x

metric per_card from txn by card_id window tumbling 1m select count() as n, sum(amount) as total
"""
RULE_AND_QUERIES = PROGRAM[: PROGRAM.index("metric per_card")].replace(
    " tags list<string>,", ""
)
"""The program without its metric nor a list field: the Spark worker fuzz then has one keyed
processor, the rule's, which decides column-wise which rows no rule condition takes and skips
them (a metric's processor takes every row; a list field turns the column-wise test off)."""

T0_MS = 1_767_225_600_000  # 2026-01-01T00:00:00Z

#: Hypothesis examples per fuzz test: small by default (CI's time budget), more with
#: VIGIL_FUZZ_EXAMPLES=500 for a longer local run.
EXAMPLES = int(os.environ.get("VIGIL_FUZZ_EXAMPLES", "25"))

DECLARED = ("card_id", "amount", "n", "ok", "tags", "title", "ts")
"""Declared fields a mutation may change (never ``id``)."""

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner,
                                                                 max_size=3),
    max_leaves=8,
)
NON_FINITE = st.sampled_from(
    ["NaN", "Infinity", "-Infinity", "1e400", "-1e999", "1" + "0" * 400, "-" + "9" * 320]
)
FAR_TIMES = st.sampled_from(
    [10**15, -(10**15), 253_402_300_800_000, 1e300, -1, 0, "99999-01-01T00:00:00Z",
     "0000-01-01T00:00:00Z", "2026-13-01", 2**63, 2**64]
)


def good_event(i: int) -> dict:
    """Event ``i`` of a good input: times one second apart, nothing late."""
    return {
        "id": f"e{i}", "card_id": f"c{i % 4}",
        "amount": [2.5, 600.0, 40.0][i % 3], "n": i, "ok": i % 2 == 0,
        "tags": ["x"] if i % 5 == 0 else ["y"], "title": "alpha beta" if i % 4 == 0 else "gamma",
        "ts": T0_MS + i * 1_000,
    }


def _dumps(event: dict) -> bytes:
    return json.dumps(event, ensure_ascii=False).encode("utf-8")


def _with_raw(event: dict, field: str, raw_json: str) -> bytes:
    """The event's line with ``field`` holding ``raw_json`` (text no encoder writes)."""
    rest = {k: v for k, v in event.items() if k != field}
    text = json.dumps(rest)
    return (text[:-1] + f', "{field}": ' + raw_json + "}").encode("utf-8")


@st.composite
def bad_line(draw, i: int) -> bytes:
    """A line that breaks event ``i`` somehow (some mutations leave it a good event)."""
    event = good_event(i)
    kind = draw(st.sampled_from([
        "deep", "wide", "non_finite", "invalid_utf8", "wrong_type", "huge", "far_time",
        "random_bytes", "random_text", "surrogate", "nested_lists", "stream", "missing",
    ]))
    field = draw(st.sampled_from([*DECLARED, "extra"]))
    if kind == "deep":
        depth = draw(st.sampled_from([MAX_EVENT_DEPTH - 2, MAX_EVENT_DEPTH, 200, 1_500]))
        opener, closer = draw(st.sampled_from([("[", "]"), ('{"a": ', "}")]))
        inner = opener * depth + "1" + closer * depth
        if draw(st.booleans()):
            inner = opener * depth  # unbalanced, not JSON either
        return _with_raw(event, field, inner)
    if kind == "wide":
        width = draw(st.integers(50, 400))
        event.update({f"f{k}": k for k in range(width)})
        return _dumps(event)
    if kind == "non_finite":
        return _with_raw(event, field, draw(NON_FINITE))
    if kind == "invalid_utf8":
        data = _dumps(event)
        at = draw(st.integers(0, len(data)))
        junk = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80", b"\xfe"]))
        return data[:at] + junk + data[at:]
    if kind == "wrong_type":
        event[field] = draw(JSON_VALUES)
        return _dumps(event)
    if kind == "huge":
        # Just under the limit (in a keyword field: a text field would be analysed, slowly)
        # or just over it.
        if draw(st.booleans()):
            event["extra"] = "x" * (MAX_EVENT_BYTES - 300)
        else:
            event[draw(st.sampled_from(["title", "extra"]))] = "alpha " * (MAX_EVENT_BYTES // 6)
        return _dumps(event)
    if kind == "far_time":
        event["ts"] = draw(FAR_TIMES)
        return _dumps(event)
    if kind == "random_bytes":
        return draw(st.binary(max_size=60)).replace(b"\n", b" ")
    if kind == "random_text":
        return draw(st.text(max_size=40)).replace("\n", " ").encode("utf-8", "surrogatepass")
    if kind == "surrogate":
        return _with_raw(event, field, '"a\\udc80b"')
    if kind == "nested_lists":
        event[field] = draw(st.sampled_from([[[1]], [["x"]], [{"k": "x"}], [[{"k": [1.5]}]]]))
        return _dumps(event)
    if kind == "stream":
        event["stream"] = draw(JSON_VALUES | st.just("txn"))
        return _dumps(event)
    event.pop(field, None)
    return _dumps(event)


@st.composite
def event_file(draw, max_lines: int = 40) -> list[bytes]:
    """Lines of an input file: good events with bad lines (and blank ones) mixed in."""
    lines: list[bytes] = []
    for i in range(draw(st.integers(5, max_lines))):
        roll = draw(st.integers(0, 9))
        if roll < 6:
            lines.append(_dumps(good_event(i)))
        elif roll < 9:
            lines.append(draw(bad_line(i)))
        else:
            lines.append(draw(st.sampled_from([b"", b"   ", b"\t\r"])))
    return lines
