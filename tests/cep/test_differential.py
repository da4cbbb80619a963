"""Differential tests: the NFA runtime must report exactly what the brute-force reference does.

Random patterns use every operator (sequence, alternation, groups, every quantifier greedy and
reluctant, also over elements that may match nothing, negation, trailing absence with
``within``) and name a variable at several places now and then, with random contiguity and
skip strategies, over small random streams; the runtime is fed through random splits of
``process_event`` / ``advance_watermark`` calls with its state round-tripped through bytes.
"""

from __future__ import annotations

import math
import os

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference_matcher import ReferenceMatcher, RefEvent, cond, make_events

from cep.nfa.compiler import compile_rule
from cep.nfa.runtime import RuleState, advance_watermark, new_state, process_event
from query_lang import ast

BOUND = ["a", "b", "c", "d", "e", "f"]
NEGATED = ["x", "y"]
TYPES = ["p", "q", "r"]

# (description, predicate factory, reads variables, prev depth)
CONDITIONS = [
    ("type == {t}", lambda t, w: lambda f, c: f["type"] == t, False, 0),
    ("type != {t}", lambda t, w: lambda f, c: f["type"] != t, False, 0),
    ("v > 2", lambda t, w: lambda f, c: f["v"] > 2, False, 0),
    ("type == {t} and v <= 3", lambda t, w: lambda f, c: f["type"] == t and f["v"] <= 3, False, 0),
    ("v > prev(v)", lambda t, w: lambda f, c: c.prev(1) is not None and f["v"] > c.prev(1)["v"],
     False, 1),
    ("v >= last({w}).v", lambda t, w: _reads_last(w), True, 0),
    ("count(self) <= 2", lambda t, w: lambda f, c: len(c.bound(c.var)) <= 2, True, 0),
]


def _reads_last(w):
    def fn(f, c):
        seen = c.bound(w)
        return bool(seen) and f["v"] >= seen[-1]["v"]
    return fn


class Names:
    """Variable names for one generated pattern: fresh ones in order, or a reused one."""

    def __init__(self):
        self.bound = list(BOUND)
        self.used: list[str] = []
        self.negated = list(NEGATED)

    def var(self, reuse: int | None = None) -> str | None:
        """A fresh name, or with ``reuse`` (an index, taken modulo) an already used one.

        Returns None when every fresh name is taken and no name is reused.
        """
        if reuse is not None and self.used:
            return self.used[reuse % len(self.used)]
        if not self.bound:
            return None
        self.used.append(self.bound.pop(0))
        return self.used[-1]


#: Draws the ``reuse`` argument of :meth:`Names.var`: a fresh name three times out of four.
REUSE = st.one_of(st.none(), st.none(), st.none(), st.integers(0, 5))


@st.composite
def sub_pattern(draw, names: Names, depth: int):
    """A pattern element; its variables are fresh names or, now and then, reused ones."""
    kinds = ["var", "var"]
    if depth > 0 and len(names.bound) >= 2:
        kinds += ["seq", "alt", "quant", "quant"]
    elif depth > 0 and names.bound:
        kinds += ["quant"]
    kind = draw(st.sampled_from(kinds))
    if kind == "var" or not names.bound:
        return ast.PatVar(names.var(draw(REUSE)) or names.var(0))
    if kind == "seq":
        first = draw(sub_pattern(names, depth - 1))
        if not names.bound:
            return first
        return ast.PatSeq((first, draw(sub_pattern(names, depth - 1))))
    if kind == "alt":
        first = draw(sub_pattern(names, depth - 1))
        if not names.bound:
            return first
        return ast.PatAlt((first, draw(sub_pattern(names, depth - 1))))
    inner = draw(sub_pattern(names, depth - 1))
    lo, hi = draw(
        st.sampled_from([(0, 1), (0, None), (1, None), (2, 2), (2, None), (1, 3), (0, 2)])
    )
    return ast.PatQuant(inner, lo, hi, draw(st.booleans()))


def _nullable(p) -> bool:
    if isinstance(p, ast.PatVar):
        return False
    if isinstance(p, ast.PatSeq):
        return all(_nullable(i) for i in p.items)
    if isinstance(p, ast.PatAlt):
        return any(_nullable(o) for o in p.options)
    if isinstance(p, ast.PatAbsent):
        return True
    return p.min == 0 or _nullable(p.inner)


def show(p) -> str:
    """The pattern in the rule language's syntax (for failure messages)."""
    if isinstance(p, ast.PatVar):
        return p.name
    if isinstance(p, ast.PatAbsent):
        return f"!{p.name}"
    if isinstance(p, ast.PatSeq):
        return " ".join(show(i) for i in p.items)
    if isinstance(p, ast.PatAlt):
        return "(" + " | ".join(show(o) for o in p.options) + ")"
    if (p.min, p.max) == (0, 1):
        q = "?"
    elif (p.min, p.max) == (0, None):
        q = "*"
    elif (p.min, p.max) == (1, None):
        q = "+"
    elif p.max is None:
        q = f"{{{p.min},}}"
    else:
        q = f"{{{p.min},{p.max}}}"
    return f"({show(p.inner)}){q}{'' if p.greedy else '?'}"


def _names(p, kind) -> set[str]:
    if isinstance(p, ast.PatVar | ast.PatAbsent):
        return {p.name} if isinstance(p, kind) else set()
    if isinstance(p, ast.PatSeq):
        return set().union(*(_names(i, kind) for i in p.items))
    if isinstance(p, ast.PatAlt):
        return set().union(*(_names(o, kind) for o in p.options))
    return _names(p.inner, kind)


@st.composite
def scenario(draw):
    names = Names()
    n_items = draw(st.integers(1, 3))
    items = []
    for _ in range(n_items):
        if not names.bound:
            break
        items.append(draw(sub_pattern(names, 2)))
    if items[0] is not None and _nullable(items[0]) and draw(st.booleans()):
        items[0] = ast.PatVar(names.var()) if names.bound else items[0]
    # A negation between two non-nullable top-level items, and/or a trailing absence.
    negations = []
    if len(items) >= 2 and draw(st.booleans()):
        i = draw(st.integers(1, len(items) - 1))
        if not _nullable(items[i - 1]) and not _nullable(items[i]):
            negations.append(i)
    trailing = not _nullable(items[-1]) and draw(st.integers(0, 3)) == 0
    seq: list = []
    for i, item in enumerate(items):
        if i in negations:
            seq.append(ast.PatAbsent(names.negated.pop(0)))
        seq.append(item)
    if trailing:
        seq.append(ast.PatAbsent(names.negated.pop(0)))
    pattern = seq[0] if len(seq) == 1 else ast.PatSeq(tuple(seq))
    used = sorted(_names(pattern, ast.PatVar))
    absent = sorted(_names(pattern, ast.PatAbsent))
    conds = {}
    for v in used + absent:
        if draw(st.integers(0, 5)) == 0:
            continue  # undefined: matches any event
        desc, factory, reads, prev = draw(st.sampled_from(CONDITIONS))
        t = draw(st.sampled_from(TYPES))
        w = draw(st.sampled_from(used))
        conds[v] = (f"{v}: " + desc.format(t=t, w=w), factory(t, w), reads, prev)
    contiguity = draw(st.sampled_from(["relaxed", "strict", "any", "any for"]))
    if contiguity == "any for":
        # relaxed, but taking an event as one of these leaves the partial match as well
        chosen = draw(st.lists(st.sampled_from(used), min_size=1, unique=True))
        contiguity = "any for " + ",".join(sorted(chosen))
    skip = draw(st.sampled_from(["past_last", "to_next", "to_first", "to_last", "no_skip"]))
    skip_var = draw(st.sampled_from(used)) if skip in ("to_first", "to_last") else None
    within = draw(st.sampled_from([None, 3, 6])) if not trailing else draw(st.sampled_from([2, 5]))
    n = draw(st.integers(0, 7))
    stream = []
    ts = 0
    for _ in range(n):
        ts += draw(st.integers(0, 2))
        stream.append((draw(st.sampled_from(TYPES)), draw(st.integers(0, 5)), ts))
    splits = draw(st.lists(st.integers(0, max(n, 1)), max_size=3))
    return pattern, conds, contiguity, skip, skip_var, within, stream, sorted(set(splits))


def _self_aware(fn, var):
    """Conditions reading ``count(self)`` need the variable's own name in both engines."""
    def wrapped(f, c):
        return fn(f, _Named(c, var))
    return wrapped


class _Named:
    def __init__(self, ctx, var):
        self.ctx = ctx
        self.var = var

    def bound(self, name):
        return self.ctx.bound(name)

    def prev(self, n=1):
        return self.ctx.prev(n)


def _conditions(conds):
    return {v: _self_aware(fn, v) for v, (_, fn, _, _) in conds.items()}


def _contiguity(contiguity: str) -> tuple[str, tuple[str, ...]]:
    """``"any for a,b"`` -> ``("relaxed", ("a", "b"))``; a plain contiguity -> ``(it, ())``."""
    if contiguity.startswith("any for "):
        return "relaxed", tuple(contiguity[len("any for "):].split(","))
    return contiguity, ()


def _runtime(pattern, conds, contiguity, skip, skip_var, within, stream, splits):
    contiguity, any_for = _contiguity(contiguity)
    decl = ast.RuleDecl(
        name="r",
        streams=("s",),
        pattern=pattern,
        contiguity=contiguity,
        any_for=any_for,
        within=ast.Duration(within) if within is not None else None,
        skip=ast.SkipStrategy(skip, skip_var),
    )
    conditions = {
        v: cond(_self_aware(fn, v), variables=reads, prev=prev)
        for v, (_, fn, reads, prev) in conds.items()
    }
    rule = compile_rule(decl, conditions=conditions)
    evs = make_events(stream)
    state = new_state(rule)
    out = []
    for i, e in enumerate(evs):
        if i in splits:
            # A watermark that does not make event i late: at most its time.
            out += advance_watermark(rule, state, e.ts)
            state = RuleState.from_bytes(state.to_bytes(), rule)
        out += process_event(rule, state, e)
        if i + 1 in splits or i % 2:
            state = RuleState.from_bytes(state.to_bytes(), rule)
    out += advance_watermark(rule, state, math.inf)
    assert state.is_empty, "end of input must leave nothing pending"
    return [(m.events, m.start_ms, m.end_ms) for m in out]


def _reference(pattern, conds, contiguity, skip, skip_var, within, stream):
    contiguity, any_for = _contiguity(contiguity)
    ref = ReferenceMatcher(
        pattern, _conditions(conds), contiguity=contiguity, any_for=frozenset(any_for),
        skip=skip, skip_var=skip_var, within_ms=within,
    )
    evs = [RefEvent(i, ts, {"type": t, "v": v, "ts": ts}) for i, (t, v, ts) in enumerate(stream)]
    return [(m.events, m.start_ms, m.end_ms) for m in ref.run(evs)]


#: CI runs 400 examples; set VIGIL_DIFFERENTIAL_EXAMPLES for a longer local run.
EXAMPLES = int(os.environ.get("VIGIL_DIFFERENTIAL_EXAMPLES", "400"))


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario())
def test_runtime_matches_reference(case):
    pattern, conds, contiguity, skip, skip_var, within, stream, splits = case
    expected = _reference(pattern, conds, contiguity, skip, skip_var, within, stream)
    got = _runtime(pattern, conds, contiguity, skip, skip_var, within, stream, splits)
    assert got == expected, (
        f"pattern={show(pattern)}\nconds={[c[0] for c in conds.values()]}\n"
        f"contiguity={contiguity} skip={skip} {skip_var} within={within}\nstream={stream}"
    )
