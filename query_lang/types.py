"""Value types of the expression language and the rules that combine them."""

from __future__ import annotations

# The types an expression can have. `text` fields behave as strings in expressions.
STRING, INT, FLOAT, BOOL, TIMESTAMP, DURATION, LIST, JSON, NULL, ANY = (
    "string", "int", "float", "bool", "timestamp", "duration", "list<string>", "json", "null",
    "any",
)

DYNAMIC = frozenset({ANY, JSON})
"""Types known only at run time: a ``json`` value (an object, a list, a string, a number, a
boolean), and ``any`` (what an expression the checks reported has). Every operator and function
accepts them; a value of the wrong kind then gives null or false, as for any mismatch."""

NUMERIC = frozenset({INT, FLOAT})

UNKEYED_FIELD_TYPES = frozenset({"list<string>", "json"})
"""Declared field types a rule cannot be partitioned by (``by``): a list holds several values,
so it names no one partition (and cannot be hashed into one); a json value may be a list or
an object."""

UNGROUPED_FIELD_TYPES = UNKEYED_FIELD_TYPES | {"text"}
"""Declared field types a metric cannot group by: a list, and a ``text`` document (searched by
its words, never the name of one group)."""


def from_field_type(type_name: str) -> str:
    """The expression type of a declared field type."""
    return STRING if type_name == "text" else type_name


def describe(t: str) -> str:
    """A type in words for error messages."""
    return {
        STRING: "a string",
        INT: "an int",
        FLOAT: "a float",
        BOOL: "a boolean",
        TIMESTAMP: "a timestamp",
        DURATION: "a duration",
        LIST: "a list of strings",
        JSON: "a json value",
        NULL: "null",
        ANY: "a value",
    }.get(t, t)


def comparable(a: str, b: str) -> bool:
    """Whether ``a < b`` / ``a == b`` makes sense."""
    if DYNAMIC & {a, b} or NULL in (a, b):
        return True
    if a in NUMERIC and b in NUMERIC:
        return True
    return a == b


def arithmetic(op: str, a: str, b: str) -> str | None:
    """Result type of ``a op b``, or None when the combination is an error."""
    if DYNAMIC & {a, b} or NULL in (a, b):
        return ANY if NULL not in (a, b) else NULL
    if a in NUMERIC and b in NUMERIC:
        if op == "/" or FLOAT in (a, b):
            return FLOAT
        return INT
    if op == "-" and a == TIMESTAMP and b == TIMESTAMP:
        return DURATION
    if op in ("+", "-") and a == TIMESTAMP and b == DURATION:
        return TIMESTAMP
    if op == "+" and a == DURATION and b == TIMESTAMP:
        return TIMESTAMP
    if op in ("+", "-") and a == DURATION and b == DURATION:
        return DURATION
    if op in ("*", "/") and a == DURATION and b in NUMERIC:
        return DURATION
    if op == "*" and a in NUMERIC and b == DURATION:
        return DURATION
    if op == "/" and a == DURATION and b == DURATION:
        return FLOAT
    return None
