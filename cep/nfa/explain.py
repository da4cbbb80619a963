"""Human-readable views of a compiled rule for ``vigil explain``: plain text and Graphviz DOT.

Both show the NFA the runtime executes: one state per pattern step (a variable occurrence),
the TAKE edges leaving each state in preference order, the negations (``!x``) a PROCEED path
crosses, and where the pattern may ACCEPT.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cep.nfa.automaton import TAIL_GREEDY, TAIL_RELUCTANT, ClosureItem

if TYPE_CHECKING:
    from cep.nfa.compiler import CompiledRule

__all__ = ["describe", "to_dot"]

_TAIL = {TAIL_GREEDY: " (trailing, greedy)", TAIL_RELUCTANT: " (trailing, reluctant)"}


def _step(rule: CompiledRule, letter: int) -> str:
    return f"{rule.variables[rule.letters[letter].var]}#{letter}"


def _guards(rule: CompiledRule, item: ClosureItem) -> str:
    if not item.guards:
        return ""
    names = sorted(rule.variables[rule.guards[g]] for g in item.guards)
    return " unless " + ", ".join(names) + " occurs first"


def _edges(rule: CompiledRule, items: tuple[ClosureItem, ...]) -> list[str]:
    out = []
    for item in items:
        if item.is_accept:
            target = "ACCEPT" if not item.guards else "ACCEPT at window end"
        else:
            target = f"TAKE {_step(rule, item.letter)}"
        out.append(target + _guards(rule, item))
    return out


def describe(rule: CompiledRule) -> str:
    """A text listing of the rule's variables, NFA states and edges.

    Examples
    --------
    >>> from query_lang.parser import parse
    >>> from cep.nfa.compiler import compile_rule
    >>> decl = parse("stream s (v int)\\nrule r from s pattern a b+ within 5m").declarations[1]
    >>> print(describe(compile_rule(decl)))  # doctest: +NORMALIZE_WHITESPACE
    rule r (version 1): contiguity relaxed, partials all, skip past_last, within 300000 ms
    variables: a (any event), b (any event)
    START -> TAKE a#0
    after a#0 -> TAKE b#1
    after b#1 (trailing, greedy) -> TAKE b#2 | ACCEPT
    after b#2 (trailing, greedy) -> TAKE b#2 | ACCEPT
    """
    window = f"within {rule.within_ms} ms" if rule.within_ms is not None else "no window"
    lines = [
        f"rule {rule.name} (version {rule.version}): contiguity {rule.contiguity}"
        + ("" if not rule.any_vars else " (any for "
           + ", ".join(rule.variables[i] for i in sorted(rule.any_vars)) + ")")
        + ", partials "
        f"{rule.partials}, skip {rule.skip}, {window}"
        + ("" if rule.unique is None else
           f", unique over {len(rule.unique)} value(s)"
           + ("" if rule.unique_ms is None else f" for {rule.unique_ms} ms"))
        + ("" if rule.having is None else ", matches filtered by its having")
    ]
    described = []
    for name, cond in zip(rule.variables, rule.conditions, strict=True):
        parts = []
        if cond.stream:
            parts.append(f"stream {cond.stream}")
        if cond.predicate is None:
            parts.append("any event")
        else:
            parts.append("condition")
            if cond.reads_variables:
                parts.append("reads earlier variables")
            if cond.prev_depth:
                parts.append(f"reads prev up to {cond.prev_depth}")
            if cond.current_only:
                parts.append("vectorised")
            elif cond.columnar is not None:
                parts.append("vectorised prefilter")
        role = "" if rule.variables.index(name) in rule.bound_vars else "negated, "
        described.append(f"{name} ({role}{', '.join(parts)})")
    lines.append("variables: " + ", ".join(described))
    lines.append("START -> " + " | ".join(_edges(rule, rule.start)))
    for i, items in enumerate(rule.after):
        tail = _TAIL.get(rule.letters[i].tail, "")
        lines.append(f"after {_step(rule, i)}{tail} -> " + (" | ".join(_edges(rule, items))))
    return "\n".join(lines)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def to_dot(rule: CompiledRule) -> str:
    """The NFA as a Graphviz digraph: states per pattern step, TAKE edges in preference order.

    Examples
    --------
    >>> from query_lang.parser import parse
    >>> from cep.nfa.compiler import compile_rule
    >>> decl = parse("stream s (v int)\\nrule r from s pattern a b").declarations[1]
    >>> print(to_dot(compile_rule(decl)).splitlines()[0])
    digraph "r" {
    """
    lines = [
        f"digraph {_quote(rule.name)} {{",
        "  rankdir=LR;",
        '  START [shape=point];',
        '  ACCEPT [shape=doublecircle, label="accept"];',
    ]
    for i in range(len(rule.letters)):
        lines.append(f"  s{i} [shape=circle, label={_quote(_step(rule, i))}];")
    sources = [("START", rule.start)] + [(f"s{i}", items) for i, items in enumerate(rule.after)]
    for source, items in sources:
        for rank, item in enumerate(items, start=1):
            target = "ACCEPT" if item.is_accept else f"s{item.letter}"
            label = "" if item.is_accept else rule.variables[rule.letters[item.letter].var]
            if item.guards:
                negated = ",".join(sorted(rule.variables[rule.guards[g]] for g in item.guards))
                label = f"{label} !{negated}".strip()
            style = ", style=dashed" if item.is_accept and item.guards else ""
            lines.append(
                f"  {source} -> {target} [label={_quote(f'{rank}: {label}'.rstrip(': '))}{style}];"
            )
    lines.append("}")
    return "\n".join(lines)
