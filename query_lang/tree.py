"""The generic machinery of the syntax tree: the base class of its nodes, and the one way to walk
a tree of them (:func:`walk`, :func:`children`) and to rebuild one (:func:`transform`). A node's
children are the nodes in its dataclass fields, directly or inside tuples and lists.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

__all__ = ["Node", "children", "transform", "walk"]


@dataclasses.dataclass(frozen=True)
class Node:
    """Base of every syntax-tree node."""


N = TypeVar("N", bound=Node)

_FIELDS: dict[type, tuple[str, ...]] = {}


def _child_fields(cls: type) -> tuple[str, ...]:
    """Names of the fields of ``cls`` that may hold child nodes (all but ``span``)."""
    names = _FIELDS.get(cls)
    if names is None:
        if dataclasses.is_dataclass(cls):
            names = tuple(f.name for f in dataclasses.fields(cls) if f.name != "span")
        else:
            names = ()
        _FIELDS[cls] = names
    return names


def _collect(value: Any, found: list[Node]) -> None:
    if isinstance(value, Node):
        found.append(value)
    elif isinstance(value, tuple | list):
        for item in value:
            _collect(item, found)


def _children(node: Node) -> list[Node]:
    found: list[Node] = []
    for name in _child_fields(type(node)):
        _collect(getattr(node, name), found)
    return found


def children(node: Node) -> Iterator[Node]:
    """The direct child nodes of ``node``, in field order (items of a tuple in order).

    Examples
    --------
    >>> from query_lang.ast import BinOp, FieldRef, Literal
    >>> list(children(BinOp("+", FieldRef("x"), Literal(1))))
    [FieldRef(name='x', qualifier=None), Literal(value=1)]
    """
    yield from _children(node)


def walk(node: Node, descend: Callable[[Node], bool] | None = None) -> Iterator[Node]:
    """``node`` and every node below it, in pre-order (a node before its children).

    ``descend``, when given, decides for each visited node whether to visit its children too;
    it is asked after the node has been yielded, so a caller may act on a node before the walk
    goes below it.

    Examples
    --------
    >>> from query_lang.ast import BinOp, Call, FieldRef, Literal
    >>> e = BinOp(">", Call("abs", (FieldRef("x"),)), Literal(1))
    >>> [type(n).__name__ for n in walk(e)]
    ['BinOp', 'Call', 'FieldRef', 'Literal']
    >>> [type(n).__name__ for n in walk(e, descend=lambda n: not isinstance(n, Call))]
    ['BinOp', 'Call', 'Literal']
    """
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        if descend is None or descend(current):
            stack.extend(reversed(_children(current)))


def transform(node: N, fn: Callable[[Node], Node]) -> N:
    """Rebuild ``node`` bottom-up: each node's children are transformed first, then ``fn`` is
    applied to the node (rebuilt with :func:`dataclasses.replace` where a child changed).

    ``fn`` returns its argument to keep a node. Nothing is copied when nothing changes: the
    result is then ``node`` itself. Spans are kept. ``fn`` meets the nodes in post-order, left
    to right; iterative, so any depth is rebuilt.

    Examples
    --------
    >>> from query_lang.ast import BinOp, FieldRef, Literal
    >>> def rename(n):
    ...     return FieldRef("y") if n == FieldRef("x") else n
    >>> transform(BinOp("+", FieldRef("x"), Literal(1)), rename)
    BinOp(op='+', left=FieldRef(name='y', qualifier=None), right=Literal(value=1))
    """
    # Pre-order with the last child first; reversed, it is post-order with the first first.
    order: list[tuple[Node, int]] = []
    pending = [node]
    while pending:
        current = pending.pop()
        found = _children(current)
        order.append((current, len(found)))
        pending.extend(found)
    done: list[Node] = []
    for current, count in reversed(order):
        results = iter(done[len(done) - count:]) if count else iter(())
        if count:
            del done[len(done) - count:]
        changes = {}
        for name in _child_fields(type(current)):
            value = getattr(current, name)
            new = _rebuilt_value(value, results)
            if new is not value:
                changes[name] = new
        rebuilt = dataclasses.replace(current, **changes) if changes else current
        done.append(fn(rebuilt))
    return done[0]  # type: ignore[return-value]


def _rebuilt_value(value: Any, results: Iterator[Node]) -> Any:
    """``value`` with each node in it (directly or in tuples and lists) replaced by the next of
    ``results``, the transformed children in :func:`_children` order."""
    if isinstance(value, Node):
        return next(results)
    if isinstance(value, tuple | list):
        items = [_rebuilt_value(item, results) for item in value]
        if any(new is not old for new, old in zip(items, value, strict=True)):
            return type(value)(items)
    return value
