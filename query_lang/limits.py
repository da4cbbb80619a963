"""The compile limits of the language, and the one count behind each.

``vigil check`` (:mod:`query_lang.checks`), the parser and the compilers (``cep.nfa``,
``cep.metrics``) all call the functions here, so a program that ``check`` accepts is one that
``run`` and ``explain`` compile, and a program over a limit is refused by every path with the
same message at the same place, naming the limit and the value found: a
:class:`~query_lang.errors.VigilLimitError` from the parser and the checks, the compiler's own
error (with that one as its cause) from a compiler.

The numbers, and why each (``docs/language.md``, *Checks beyond the specification's list*):

======================  =======  ==========================================================
limit                   value    counts
======================  =======  ==========================================================
pattern variables       62       distinct variables of a rule's pattern, ``!x`` included
pattern steps           4,096    variable occurrences once ``{n,m}`` is unrolled
pattern transitions     100,000  steps that may follow the start and each step, summed
nesting depth           100      parentheses and prefix operators in the text, and levels of
                                 an expression, pattern or search query's syntax tree
duration                36,500d  any duration (``within``, windows, ``lateness``, ...)
number digits           100      digits of one number, duration or quantifier
include depth           32       files in a chain of includes
======================  =======  ==========================================================

Examples
--------
>>> from query_lang import parse
>>> rule = parse("rule r from s pattern a{5000} b").declarations[0]
>>> pattern_steps(rule.pattern)
4097
>>> [e.message for e in rule_limit_errors(rule)]  # doctest: +NORMALIZE_WHITESPACE
["rule 'r': pattern too large: 5,001 steps once its quantifiers are unrolled; the limit is
  4,096 (pattern steps): use smaller {n,m} bounds"]
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import get_args

from query_lang import ast
from query_lang.errors import VigilLimitError

__all__ = [
    "MAX_DURATION_MS",
    "MAX_INCLUDE_DEPTH",
    "MAX_NESTING_DEPTH",
    "MAX_NUMBER_DIGITS",
    "MAX_PATTERN_STEPS",
    "MAX_PATTERN_TRANSITIONS",
    "MAX_PATTERN_VARIABLES",
    "declaration_limit_errors",
    "deepest_node",
    "duration_errors",
    "metric_limit_errors",
    "nesting_errors",
    "pattern_limit_errors",
    "pattern_steps",
    "pattern_transitions",
    "pattern_variables",
    "rule_limit_errors",
]

MAX_PATTERN_VARIABLES = 62
"""Most distinct variables in a rule's pattern (``!x`` counts; a variable named at several
places counts once).

A compiled rule gives each variable one bit of a signed 64-bit mask (the column-wise test of a
batch, :meth:`cep.nfa.compiler.CompiledRule.columnar_mask`, and the strict-contiguity scan).
62 keeps every mask positive with a bit to spare, so no shift or comparison of a mask ever
reaches the sign bit."""

MAX_PATTERN_STEPS = 4096
"""Most steps of a rule's pattern once its quantifiers are unrolled: ``a{3} b`` has 4,
``(a | b){2,5}`` has 10, ``a+`` has 2 (one mandatory copy, one loop).

Every step is a TAKE edge of the automaton with its own PROCEED closure, built at compile time
and held by every key's runtime; the bound keeps a typo such as ``{1,100000}`` from exhausting
memory and compile time, while leaving room for any pattern written by hand."""

MAX_PATTERN_TRANSITIONS = 100_000
"""Most PROCEED transitions of a rule's automaton (:func:`pattern_transitions`): how many steps
may follow the start and each step, summed. ``a{4096}`` has 4,096; ``(a?){n}`` and
``(a | b | ...){n}`` grow as the square of their steps.

The compiler builds every step's closure and the runtime walks them for each partial match;
measured at some 11 µs a transition to compile, 100,000 compile in about a second. Patterns
written by hand have tens to hundreds; past the bound lies a compile of minutes
(``(a?){4096}`` has 8 million)."""

MAX_NESTING_DEPTH = 100
"""How deeply anything may nest: parentheses and prefix operators (``not``, unary ``-``, and
search's ``NOT``, ``!``, ``-``, ``+``) in the text, and levels of the syntax tree of an
expression, a pattern or a search query (a chain ``a + b + c ...`` is one level a term: it is
evaluated left to right).

The checks, the printer and the compilers walk these trees recursively. Measured at Python's
default recursion limit of 1,000 frames from a shallow stack, the hungriest walks survive about
200 levels (printing nested calls ``abs(abs(...))``, five frames a level), the NFA compiler and
tree rewriting about 250, the others 330 to 990. 100 leaves half the stack to the callers (a
test runner, the command line, Spark), and is far deeper than any rule written by hand. The
text is measured while it is read, before anything is built, so even 100,000 parentheses are
refused at once, at the parenthesis that goes too deep."""

MAX_DURATION_MS = 36_500 * 86_400_000
"""The longest duration (``within``, a window's size and step, ``lateness``, ``throttle``, a
duration in an expression): 36,500 days, 100 years.

Event times reach at most the year 8999 (``cep.events.time_bounds.LATEST_EVENT_MS``), and times
computed from them (an absence's deadline, a window's end plus its lateness) must still print
as ISO-8601, whose years end at 9999: a few durations of 100 years each keep such a sum inside,
and every sum inside 64-bit integers. No window, deadline or retention anyone means is
longer."""

MAX_NUMBER_DIGITS = 100
"""Most digits in one number, duration or quantifier of the text (and in a search word that
reads as a number).

No quantity an event holds needs more (a 64-bit integer has 19 digits; the largest float,
written out, 309); Python refuses to read more than 4,300 digits as an integer
(a setting a process may lower to 640), which would otherwise surface as an internal error."""

MAX_INCLUDE_DEPTH = 32
"""The longest chain of includes (a file that includes a file that includes ...).

Programs share one or two levels of common declarations; loading follows a chain recursively,
so a bound keeps a generated or mistaken chain far from the recursion limit. A file included
twice is loaded once and a cycle is an error of its own."""

# The nodes whose nesting counts: expressions, patterns and search queries. Declarations,
# clauses (define, emit) and windows are a fixed few levels and do not count.
_NESTING = (*get_args(ast.Expr), *get_args(ast.Pattern), *get_args(ast.SearchNode))


def _limit_error(
    message: str, span: ast.Span | None, limit: str, value: int
) -> VigilLimitError:
    return VigilLimitError(message, span if span is not None and span.line else None,
                           limit=limit, value=value)


# ---------------------------------------------------------------- patterns

# Step counts shown in messages stop here: beyond, a count is astronomically large.
_SHOWN_STEPS = 10**12


def pattern_variables(pattern: ast.Pattern) -> tuple[str, ...]:
    """The distinct variables of a pattern in text order, ``!x`` included: what the compiled
    rule numbers (one mask bit each).

    >>> from query_lang import parse
    >>> pattern_variables(parse("rule r from s pattern a (b | a)+ !c").declarations[0].pattern)
    ('a', 'b', 'c')
    """
    seen: dict[str, None] = {}
    for node in ast.walk(pattern):
        if isinstance(node, ast.PatVar | ast.PatAbsent):
            seen.setdefault(node.name)
    return tuple(seen)


def pattern_steps(pattern: ast.Pattern) -> int:
    """The steps of a pattern once its quantifiers are unrolled (the compiled automaton's TAKE
    edges), counted up to ``MAX_PATTERN_STEPS + 1``: a larger count stops there, so even
    ``a{99999999}{99999999}`` is counted at once.

    ``inner{n}`` and ``inner{n,m}`` hold ``m`` copies of ``inner``; ``inner{n,}`` (``+``,
    ``*``) holds ``n`` copies and one loop copy; ``!x`` takes no step.

    >>> from query_lang import parse
    >>> pattern_steps(parse("rule r from s pattern a{3} (b | c)+ !d e?").declarations[0].pattern)
    8
    """
    return _steps(pattern, MAX_PATTERN_STEPS + 1)


def _steps(p: ast.Pattern, cap: int) -> int:
    # Saturating arithmetic: min(cap, x) is kept through sums and products of counts >= 0.
    # Recursion is bounded: the parser and the checks refuse trees deeper than MAX_NESTING_DEPTH.
    if isinstance(p, ast.PatVar):
        return 1
    if isinstance(p, ast.PatAbsent):
        return 0
    if isinstance(p, ast.PatSeq | ast.PatAlt):
        total = 0
        for part in p.items if isinstance(p, ast.PatSeq) else p.options:
            total = min(cap, total + _steps(part, cap))
        return total
    # As the compiler unrolls: min copies, then max - min optional ones or one loop copy.
    copies = p.min + 1 if p.max is None else max(p.min, p.max)
    if copies <= 0:
        return 0
    return min(cap, copies * _steps(p.inner, cap))


def pattern_transitions(pattern: ast.Pattern) -> int:
    """The PROCEED transitions of a pattern's automaton once its quantifiers are unrolled: for
    the start and for each step, how many steps may come next. ``a b c`` has 3, ``(a | b){3}``
    has 10, ``(a?){n}`` about n²/2: every step may be followed by any later one.

    Counted on the syntax tree (first and last steps of each part, as for a Glushkov
    automaton), for a pattern within :data:`MAX_PATTERN_STEPS`.

    >>> from query_lang import parse
    >>> pattern_transitions(parse("rule r from s pattern (a | b){3}").declarations[0].pattern)
    10
    """
    first, _, _, inner = _shape(pattern)
    return first + inner


# The shape of a part of a pattern: how many steps may start it and end it, whether it may match
# nothing, and the transitions inside it.
_Shape = tuple[int, int, bool, int]
_EMPTY: _Shape = (0, 0, True, 0)


def _then(a: _Shape, b: _Shape) -> _Shape:
    """The shape of ``a`` followed by ``b``: every last step of ``a`` may go on to every first
    step of ``b``, and where ``a`` (``b``) may be empty the other's firsts (lasts) show through.
    """
    first = a[0] + (b[0] if a[2] else 0)
    last = b[1] + (a[1] if b[2] else 0)
    return first, last, a[2] and b[2], a[3] + b[3] + a[1] * b[0]


def _shape(p: ast.Pattern) -> _Shape:
    if isinstance(p, ast.PatVar):
        return 1, 1, False, 0
    if isinstance(p, ast.PatAbsent):
        return _EMPTY
    if isinstance(p, ast.PatSeq):
        shape = _EMPTY
        for item in p.items:
            shape = _then(shape, _shape(item))
        return shape
    if isinstance(p, ast.PatAlt):
        shapes = [_shape(o) for o in p.options]
        return (sum(s[0] for s in shapes), sum(s[1] for s in shapes),
                any(s[2] for s in shapes), sum(s[3] for s in shapes))
    inner = _shape(p.inner)
    if inner[0] == inner[1] == inner[3] == 0:
        return 0, 0, inner[2] or p.min == 0, 0  # no step inside: however often repeated
    shape = _EMPTY
    for _ in range(p.min):  # unrolled as the compiler does: min copies, then the rest
        shape = _then(shape, inner)
    if p.max is None:  # one loop copy: its last steps go back to its first
        loop = (inner[0], inner[1], True, inner[3] + inner[1] * inner[0])
        return _then(shape, loop)
    rest = _EMPTY
    for _ in range(p.max - p.min):  # optional copies, each inside the one before
        following = _then(inner, rest)
        rest = (following[0], following[1], True, following[3])
    return _then(shape, rest)


def _steps_culprit(p: ast.Pattern) -> ast.Pattern:
    """The smallest part of a pattern that is over the step limit on its own (the quantifier
    to shrink), else the pattern itself."""
    limit = MAX_PATTERN_STEPS
    while isinstance(p, ast.PatSeq | ast.PatAlt):
        parts = p.items if isinstance(p, ast.PatSeq) else p.options
        over = [part for part in parts if _steps(part, limit + 1) > limit]
        if not over:
            break
        p = over[0]
    return p


def pattern_limit_errors(name: str, pattern: ast.Pattern) -> list[VigilLimitError]:
    """The pattern of rule ``name`` over :data:`MAX_PATTERN_VARIABLES`,
    :data:`MAX_PATTERN_STEPS` or :data:`MAX_PATTERN_TRANSITIONS`."""
    found = []
    variables = pattern_variables(pattern)
    if len(variables) > MAX_PATTERN_VARIABLES:
        extra = variables[MAX_PATTERN_VARIABLES]
        at = next(
            n.span for n in ast.walk(pattern)
            if isinstance(n, ast.PatVar | ast.PatAbsent) and n.name == extra
        )
        found.append(_limit_error(
            f"rule '{name}': pattern too large: {len(variables)} variables; the limit is "
            f"{MAX_PATTERN_VARIABLES} (pattern variables), and '{extra}' is one too many",
            at, "MAX_PATTERN_VARIABLES", len(variables),
        ))
    if pattern_steps(pattern) > MAX_PATTERN_STEPS:
        steps = _steps(pattern, _SHOWN_STEPS)
        shown = f"{steps:,}" if steps < _SHOWN_STEPS else f"more than {_SHOWN_STEPS:,}"
        found.append(_limit_error(
            f"rule '{name}': pattern too large: {shown} steps once its quantifiers are "
            f"unrolled; the limit is {MAX_PATTERN_STEPS:,} (pattern steps): use smaller {{n,m}} "
            "bounds",
            _steps_culprit(pattern).span, "MAX_PATTERN_STEPS", steps,
        ))
    elif (transitions := pattern_transitions(pattern)) > MAX_PATTERN_TRANSITIONS:
        found.append(_limit_error(
            f"rule '{name}': pattern too large: its automaton has {transitions:,} transitions; "
            f"the limit is {MAX_PATTERN_TRANSITIONS:,} (pattern transitions): a repeated optional "
            "part or a wide alternation lets each step be followed by many others; use smaller "
            "{n,m} bounds or fewer alternatives",
            pattern.span, "MAX_PATTERN_TRANSITIONS", transitions,
        ))
    return found


# ---------------------------------------------------------------- nesting


def deepest_node(node: ast.Node) -> tuple[int, ast.Node]:
    """How deeply expressions, patterns and search queries nest under ``node`` (0: not at all,
    1: ``not x``) and the first node, in text order, at that depth. Iterative: any depth is
    measured.

    >>> from query_lang.parser import parse_expr
    >>> deepest_node(parse_expr("not (a > -b)"))
    (3, FieldRef(name='b', qualifier=None))
    """
    best: tuple[int, ast.Node] = (0, node)
    stack: list[tuple[ast.Node, int]] = [(node, 0)]
    while stack:
        current, depth = stack.pop()
        if depth > best[0]:
            best = (depth, current)
        below = depth + 1 if isinstance(current, _NESTING) else 0
        stack.extend((child, below) for child in reversed(list(ast.children(current))))
    return best


def nesting_errors(
    node: ast.Node, where: ast.Span | None = None, prefix: str = ""
) -> list[VigilLimitError]:
    """``node`` nested deeper than :data:`MAX_NESTING_DEPTH`, located at the first node too
    deep (or ``where`` when that node has no position); ``prefix`` starts the message."""
    depth, deepest = deepest_node(node)
    if depth <= MAX_NESTING_DEPTH:
        return []
    # The node just past the limit on the way to the deepest one: where to start simplifying.
    at = _node_at_depth(node, MAX_NESTING_DEPTH + 1) or deepest
    span = getattr(at, "span", None)
    if span is None or not span.line:
        span = where
    return [_limit_error(
        f"{prefix}nested too deeply: {depth} levels, the limit is {MAX_NESTING_DEPTH} (nesting "
        "depth); each parenthesised group, prefix operator and term of a chain such as "
        "a + b + c is a level: simplify or split it",
        span, "MAX_NESTING_DEPTH", depth,
    )]


def _node_at_depth(node: ast.Node, wanted: int) -> ast.Node | None:
    stack: list[tuple[ast.Node, int]] = [(node, 0)]
    while stack:
        current, depth = stack.pop()
        if depth == wanted:
            return current
        below = depth + 1 if isinstance(current, _NESTING) else 0
        stack.extend((child, below) for child in reversed(list(ast.children(current))))
    return None


# ---------------------------------------------------------------- durations


def duration_errors(node: ast.Node, prefix: str = "") -> list[VigilLimitError]:
    """Every duration under ``node`` longer than :data:`MAX_DURATION_MS`; ``prefix`` starts
    each message."""
    return [
        _limit_error(
            f"{prefix}duration {_days(d.ms)} is longer than the limit of "
            f"{_days(MAX_DURATION_MS)} (100 years)",
            d.span, "MAX_DURATION_MS", d.ms,
        )
        for d in _durations(node)
        if d.ms > MAX_DURATION_MS
    ]


def _durations(node: ast.Node) -> Iterator[ast.Duration]:
    for found in ast.walk(node):
        if isinstance(found, ast.Duration):
            yield found


def _days(ms: int) -> str:
    days = ms / 86_400_000
    if days >= 1e15:
        return f"of about {days:.3g} days"
    return f"{ms // 86_400_000:,}d" if ms % 86_400_000 == 0 else f"of {days:,.1f} days"


# ---------------------------------------------------------------- declarations


def rule_limit_errors(rule: ast.RuleDecl) -> list[VigilLimitError]:
    """Every limit a rule is over: nesting, its pattern's variables, steps and transitions,
    durations. The NFA compiler refuses a rule with any
    (:func:`cep.nfa.compiler.compile_rule`), with the same message."""
    prefix = f"rule '{rule.name}': "
    deep = nesting_errors(rule, rule.span, prefix)
    if deep:
        return deep  # the other counts walk the tree recursively
    return [*pattern_limit_errors(rule.name, rule.pattern), *duration_errors(rule, prefix)]


def metric_limit_errors(metric: ast.MetricDecl) -> list[VigilLimitError]:
    """Every limit a metric is over: nesting and durations (its window, ``throttle``). The
    metric compiler refuses a metric with any (:func:`cep.metrics.compile_metric`)."""
    prefix = f"metric '{metric.name}': "
    return nesting_errors(metric, metric.span, prefix) or duration_errors(metric, prefix)


def declaration_limit_errors(decl: ast.Node) -> list[VigilLimitError]:
    """Every limit a declaration of any kind is over, for the checks (``vigil check``)."""
    if isinstance(decl, ast.RuleDecl):
        return rule_limit_errors(decl)
    if isinstance(decl, ast.MetricDecl):
        return metric_limit_errors(decl)
    name = getattr(decl, "name", None)
    kind = type(decl).__name__.removesuffix("Decl").lower()
    prefix = f"{kind} '{name}': " if name else ""
    span = getattr(decl, "span", None)
    return nesting_errors(decl, span, prefix) or duration_errors(decl, prefix)
