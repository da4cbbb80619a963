"""EQL text to the ``eql`` package's syntax tree, keeping what that tree forgets: where each node
was written, and which operators asked for case-insensitive matching (``:``, ``like~``,
``in~``, ``startsWith~`` ... all become one node type in the package's tree).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from eql import ast as eql_ast
from eql.errors import EqlError, EqlParseError
from eql.parser import LarkToEQL, lark_parser
from eql.types import NodeInfo
from eql.utils import ParserConfig, load_extensions
from lark import Token, Tree
from lark.exceptions import LarkError, UnexpectedInput

from query_lang.ast import Span
from query_lang.imports.eql.errors import EqlImportError

__all__ = ["DIALECTS", "ParsedQuery", "parse_eql"]

DIALECTS = ("elasticsearch", "classic")
"""``elasticsearch``: Elasticsearch's EQL (detection rules; ``==`` is exact, ``:`` and the
``~`` forms ignore case). ``classic``: the ``eql`` package's own language (``==`` compares
case-insensitively and takes ``*`` wildcards, as its Python engine does)."""


@dataclass
class ParsedQuery:
    """An EQL query parsed by the ``eql`` package, with the positions and case flags of its
    nodes.

    ``operator_of`` maps a node (by ``id``) to the operator written for it when the tree does
    not say: ``":"``, ``"like"``, ``"like~"``, ``"regex"``, ``"regex~"``, ``"in~"``, or a
    function name ending in ``~``.
    """

    query: Any
    text: str
    file: str
    line_offset: int = 0
    dialect: str = "elasticsearch"
    origins: dict[int, tuple[int, int]] = field(default_factory=dict)
    operator_of: dict[int, str] = field(default_factory=dict)
    # The nodes the maps name, kept alive so that their ids are never reused.
    keep: list[Any] = field(default_factory=list)

    def span(self, node: Any) -> Span:
        """Where ``node`` was written (its start), in the file the query came from."""
        line, column = self.origins.get(id(node), (1, 1))
        return Span(self.file, line + self.line_offset, column)

    def error(self, node: Any, message: str, construct: str) -> EqlImportError:
        return EqlImportError(message, self.span(node), self.source(), construct=construct)

    def source(self) -> str:
        """The file's text as far as the error printer needs it (lines up to the query's)."""
        return "\n" * self.line_offset + self.text


class _Walker(LarkToEQL):
    """The package's tree builder, remembering positions and case-insensitive operators."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.origins: dict[int, tuple[int, int]] = {}
        self.operator_of: dict[int, str] = {}
        self.keep: list[Any] = []

    def _remember(self, result: Any, tree: Any) -> None:
        node = result.node if isinstance(result, NodeInfo) else result
        if isinstance(node, eql_ast.BaseNode) and id(node) not in self.origins:
            token = _first_token(tree)
            if token is not None:
                self.origins[id(node)] = (token.line, token.column)
                self.keep.append(node)

    def _visit_tree(self, tree):
        # Every tree the walker visits passes here (``visit`` and ``visit_children`` alike).
        result = super()._visit_tree(tree)
        self._remember(result, tree)
        return result

    def _mark(self, info: Any, operator: str) -> Any:
        node = info.node if isinstance(info, NodeInfo) else info
        self.operator_of[id(node)] = operator
        self.keep.append(node)
        return info

    def string_predicate(self, node):
        return self._mark(super().string_predicate(node), str(node["STRING_PREDICATE"]))

    def in_set(self, node):
        info = super().in_set(node)
        return self._mark(info, "in~") if node.get("IN") == "in~" else info

    def function_call(self, node, prev_node=None, prev_arg=None):
        info = super().function_call(node, prev_node, prev_arg)
        name = node.children[0] if node.data != "method" else None
        if name is not None and str(name).endswith("~"):
            self._mark(info, str(name))
        return info

    def subquery_by(self, node, *args, **kwargs):
        result = super().subquery_by(node, *args, **kwargs)
        self._remember(result[0], node)
        return result


def _first_token(tree: Any) -> Token | None:
    # The package's parser keeps no positions on trees; their first token has one.
    for child in tree.children:
        if isinstance(child, Token):
            return child
        if isinstance(child, Tree):
            found = _first_token(child)
            if found is not None:
                return found
    return None


def parse_eql(
    text: str, *, dialect: str = "elasticsearch", file: str = "<eql>", line_offset: int = 0
) -> ParsedQuery:
    """Parse one EQL query (with its pipes) as ``dialect`` reads it.

    Errors of the ``eql`` package come back as :class:`EqlImportError` at their line and
    column (``line_offset`` lines into ``file``, for a query inside a TOML file).

    Examples
    --------
    >>> parsed = parse_eql('process where process.name : "cmd*"')
    >>> type(parsed.query.first).__name__, sorted(parsed.operator_of.values())
    ('EventQuery', [':'])
    """
    if dialect not in DIALECTS:
        raise ValueError(f"unknown EQL dialect {dialect!r}: one of {', '.join(DIALECTS)}")
    body = text if text.endswith("\n") else text + "\n"
    options: dict[str, Any] = {"optimized": False}
    if dialect == "elasticsearch":
        options.update(elasticsearch_syntax=True, allow_negation=True, allow_runs=True)
    parsed = ParsedQuery(None, body, file, line_offset, dialect)
    if not text.strip():
        raise EqlImportError("no EQL query", Span(file, line_offset + 1, 1), parsed.source(),
                             construct="syntax")
    load_extensions(force=False)
    with ParserConfig(**options):
        walker = _Walker(body)
        try:
            tree = lark_parser.parse(body, start="piped_query")
            node = walker.visit(tree)
        except UnexpectedInput as err:
            raise EqlImportError(
                "EQL syntax error", Span(file, err.line + line_offset, err.column),
                parsed.source(), construct="syntax",
            ) from None
        except LarkError as err:
            raise EqlImportError(f"EQL syntax error: {err}", Span(file, line_offset + 1, 1),
                                 parsed.source(), construct="syntax") from None
        except EqlParseError as err:
            raise EqlImportError(
                err.error_msg, Span(file, err.line + 1 + line_offset, err.column + 1),
                parsed.source(), construct="syntax",
            ) from None
        except EqlError as err:
            raise EqlImportError(str(err), Span(file, line_offset + 1, 1), parsed.source(),
                                 construct="syntax") from None
        except (AttributeError, TypeError, KeyError, IndexError) as err:
            # The package fails so on some invalid queries (an `events[i]` past the end of a
            # sequence reaches a broken error path): still the query's fault, said as such.
            raise EqlImportError(
                f"the eql package could not read this query ({type(err).__name__}: {err})",
                Span(file, line_offset + 1, 1), parsed.source(), construct="syntax",
            ) from None
    parsed.query = node.node if isinstance(node, NodeInfo) else node
    parsed.origins, parsed.operator_of = walker.origins, walker.operator_of
    parsed.keep = walker.keep
    return parsed
