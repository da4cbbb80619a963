"""The automaton of a rule's pattern: bounded quantifiers unrolled, a Thompson ε-NFA whose
ε-edges are ordered by backtracking preference and may carry negation guards (``!x``), reduced to
*letters* (TAKE edges, one per variable occurrence) and the ordered ε-closure (PROCEED edges)
after each."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field

from cep.nfa.errors import RuleCompileError
from query_lang import ast
from query_lang.ast import nullable
from query_lang.limits import MAX_PATTERN_STEPS

__all__ = [
    "MAX_LETTERS",
    "TAIL_GREEDY",
    "TAIL_NONE",
    "TAIL_RELUCTANT",
    "ClosureItem",
    "Letter",
    "PatternBuilder",
    "StateSummary",
    "check_negations",
    "nullable",
    "pattern_occurrences",
    "with_places",
]

#: Upper bound on letters after unrolling ``{n,m}``: the language's limit on pattern steps
#: (:data:`query_lang.limits.MAX_PATTERN_STEPS`, why it is that number), which
#: :func:`cep.nfa.compiler.compile_rule` checks before building.
MAX_LETTERS = MAX_PATTERN_STEPS

TAIL_NONE = 0
TAIL_GREEDY = 1
TAIL_RELUCTANT = 2


@dataclass(frozen=True)
class Letter:
    """One occurrence of a variable in the expanded pattern: a TAKE edge.

    ``tail`` says whether the occurrence lies inside a trailing quantifier of the pattern
    (greedy or reluctant), which decides when a match that could still grow is reported.
    ``place`` is the variable's place in the pattern text (:attr:`CompiledRule.places`): the
    copies of one place made by unrolling ``{n,m}`` share it, two places of ``a b a`` do not.
    """

    index: int
    var: int
    place: int
    tail: int = TAIL_NONE


@dataclass(frozen=True)
class ClosureItem:
    """An entry of an ordered ε-closure: a TAKE of ``letter`` or reaching ACCEPT (letter -1).

    ``guards`` are the negations the PROCEED path crosses: the path is valid only when no event
    since the last TAKE satisfied one of them.
    """

    letter: int
    guards: frozenset[int] = frozenset()

    @property
    def is_accept(self) -> bool:
        return self.letter < 0


@dataclass
class _Node:
    eps: list[tuple[int, int | None]] = field(default_factory=list)
    take: tuple[int, int] | None = None
    accept: bool = False
    #: Entry (``opens``) and exit (``closes``) of an iteration beyond a quantifier's minimum
    #: whose body may match nothing: a PROCEED path may not cross both (an empty iteration).
    opens: int = -1
    closes: int = -1


@dataclass(frozen=True)
class StateSummary:
    """What the runtime needs to know about a set of letters (a partial match's position)."""

    takes: dict[int, tuple[tuple[int, frozenset[int]], ...]]  # place -> (letter, guards) ...
    accepts: tuple[frozenset[int], ...]
    guards: frozenset[int]
    greedy_tail_take: bool
    #: place -> the letters of its takes, sorted and distinct (where it leads when no guard
    #: of the partial match is blocked)
    targets: dict[int, tuple[int, ...]] = field(default_factory=dict)


def pattern_occurrences(p: ast.Pattern) -> list[tuple[str, bool, ast.Span]]:
    """Each variable occurrence in text order: ``(name, bound (not ``!x``), span)``."""
    return [
        (node.name, isinstance(node, ast.PatVar), node.span)
        for node in ast.walk(p)
        if isinstance(node, ast.PatVar | ast.PatAbsent)
    ]


def check_negations(p: ast.Pattern) -> None:
    """``!x`` must follow an element of its own sequence: it may not start a pattern."""
    if isinstance(p, ast.PatAbsent):
        raise RuleCompileError(
            f"negation !{p.name} must follow another pattern element (it may not start a "
            "pattern or stand alone)",
            p.span,
        )
    if isinstance(p, ast.PatSeq):
        for i, item in enumerate(p.items):
            if isinstance(item, ast.PatAbsent):
                if i == 0 or all(isinstance(x, ast.PatAbsent) for x in p.items[:i]):
                    raise RuleCompileError(
                        f"negation !{item.name} must follow another pattern element "
                        "(it may not start a pattern or a group)",
                        item.span,
                    )
            else:
                check_negations(item)
    elif isinstance(p, ast.PatAlt):
        for o in p.options:
            check_negations(o)
    elif isinstance(p, ast.PatQuant):
        check_negations(p.inner)


def with_places(p: ast.Pattern, names: list[str]) -> ast.Pattern:
    """``p`` with each variable occurrence renamed to its place (``a b a`` -> ``a#0 b#1 a#2``).

    ``names`` collects the original name of each place, in text order (the order in which
    :func:`query_lang.ast.transform` meets the occurrences).
    """

    def place(node: ast.Node) -> ast.Node:
        if isinstance(node, ast.PatVar | ast.PatAbsent):
            names.append(node.name)
            return dataclasses.replace(node, name=f"{node.name}#{len(names) - 1}")
        return node

    return ast.transform(p, place)


class PatternBuilder:
    """Thompson construction with preference-ordered ε-edges and tail tagging.

    It builds a pattern whose names are places (:func:`with_places`): ``places[name]`` gives the
    place's number and its variable.
    It unrolls every quantifier: its caller first holds the pattern to the limit on steps
    (:func:`query_lang.limits.pattern_steps`), as :func:`cep.nfa.compiler.compile_rule` does.
    """

    def __init__(self, places: Mapping[str, tuple[int, int]]):
        self.nodes: list[_Node] = []
        self.letters: list[Letter] = []
        self.guards: list[int] = []
        self.targets: list[int] = []
        self.places = places
        self.iterations = 0

    def node(self) -> int:
        self.nodes.append(_Node())
        return len(self.nodes) - 1

    def build(
        self, p: ast.Pattern, trailing: bool, tag: int, inside: bool = False
    ) -> tuple[int, int]:
        """Build ``p``; ``inside`` means within a trailing quantifier tagged ``tag``."""
        if isinstance(p, ast.PatVar):
            s, t = self.node(), self.node()
            place, var = self.places[p.name]
            self.letters.append(
                Letter(
                    len(self.letters), var, place, tag if (trailing or inside) else TAIL_NONE
                )
            )
            self.nodes[s].take = (len(self.letters) - 1, t)
            self.targets.append(t)
            return s, t
        if isinstance(p, ast.PatAbsent):
            s, t = self.node(), self.node()
            self.guards.append(self.places[p.name][1])
            self.nodes[s].eps.append((t, len(self.guards) - 1))
            return s, t
        if isinstance(p, ast.PatSeq):
            entry = cur = self.node()
            items = p.items
            last_absent = max(
                (i for i, it in enumerate(items) if isinstance(it, ast.PatAbsent)), default=-1
            )
            for i, item in enumerate(items):
                item_trailing = (
                    trailing and i > last_absent and all(nullable(x) for x in items[i + 1:])
                )
                a, b = self.build(item, item_trailing, tag, inside)
                self.nodes[cur].eps.append((a, None))
                cur = b
            return entry, cur
        if isinstance(p, ast.PatAlt):
            s, t = self.node(), self.node()
            for option in p.options:
                a, b = self.build(option, trailing, tag, inside)
                self.nodes[s].eps.append((a, None))
                self.nodes[b].eps.append((t, None))
            return s, t
        return self._quantifier(p, trailing, tag, inside)

    def _quantifier(
        self, p: ast.PatQuant, trailing: bool, tag: int, inside: bool
    ) -> tuple[int, int]:
        """``inner{min,max}`` as ``min`` copies, then a loop or nested optional copies.

        The whole quantifier (every copy) carries its tail tag, so a match extended by any of
        its iterations counts as the same trailing quantifier growing.
        """
        variable = p.max is None or p.max != p.min
        if trailing and tag == TAIL_NONE and variable:
            tag = TAIL_GREEDY if p.greedy else TAIL_RELUCTANT
            inside = True
        inner_nullable = nullable(p.inner)
        entry = cur = self.node()
        for i in range(p.min):
            last_mandatory = i == p.min - 1
            copy_trailing = trailing and (last_mandatory or inner_nullable)
            a, b = self.build(p.inner, copy_trailing, tag, inside)
            self.nodes[cur].eps.append((a, None))
            cur = b
        if p.max is None:
            loop, out = self.node(), self.node()
            a, b = self.build(p.inner, trailing, tag, inside)
            self._non_empty(a, b, inner_nullable)
            self._choice(loop, a, out, p.greedy)
            self.nodes[b].eps.append((loop, None))
            self.nodes[cur].eps.append((loop, None))
            return entry, out
        out = self.node()
        for _ in range(p.max - p.min):
            a, b = self.build(p.inner, trailing, tag, inside)
            self._non_empty(a, b, inner_nullable)
            self._choice(cur, a, out, p.greedy)
            cur = b
        self.nodes[cur].eps.append((out, None))
        return entry, out

    def _non_empty(self, entry: int, exit_: int, nullable: bool) -> None:
        """Forbid an empty pass from ``entry`` to ``exit_`` (an optional iteration).

        Beyond its minimum, an iteration of a quantifier must take an event
        (docs/semantics.md, "Empty iterations"); the mandatory copies may match nothing.
        """
        if nullable:
            self.nodes[entry].opens = self.nodes[exit_].closes = self.iterations
            self.iterations += 1

    def _choice(self, at: int, enter: int, leave: int, greedy: bool) -> None:
        first, second = (enter, leave) if greedy else (leave, enter)
        self.nodes[at].eps.extend([(first, None), (second, None)])

    def closure(self, start: int) -> tuple[ClosureItem, ...]:
        """The ordered PROCEED closure of a node: TAKE and ACCEPT items in preference order."""
        out: list[ClosureItem] = []
        emitted: set[tuple[int, frozenset[int]]] = set()
        seen: set[tuple[int, frozenset[int], frozenset[int]]] = set()
        # (node, guards crossed, optional iterations entered on this path without a TAKE)
        stack: list[tuple[int, frozenset[int], frozenset[int]]] = [
            (start, frozenset(), frozenset())
        ]
        while stack:
            n, guards, entered = stack.pop()
            if (n, guards, entered) in seen:
                continue
            seen.add((n, guards, entered))
            node = self.nodes[n]
            if node.closes in entered:
                continue
            if node.opens >= 0:
                entered = entered | {node.opens}
            if node.take is not None:
                key = (node.take[0], guards)
                if key not in emitted:
                    emitted.add(key)
                    out.append(ClosureItem(node.take[0], guards))
            if node.accept:
                key = (-1, guards)
                if key not in emitted:
                    emitted.add(key)
                    out.append(ClosureItem(-1, guards))
            for target, guard in reversed(node.eps):
                stack.append(
                    (target, guards | {guard} if guard is not None else guards, entered)
                )
        return tuple(out)
