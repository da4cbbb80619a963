"""Comments: where the lexer found them, and the printed line each belongs with, so the printer
can put it back next to the code it was written next to (:class:`query_lang.ast.Comment`).

The parser records, for every declaration, which source lines the code of each of its printed
lines came from (a :data:`LineSource` per printed line). A comment then goes with the printed
line whose code it ends (a trailing comment) or precedes (a comment on a line of its own).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, replace

from lark import Token

from query_lang import ast

# A printed line of a declaration and the source lines its code came from:
# (clause, item, first line, last line), named as in :class:`query_lang.ast.Comment`.
LineSource = tuple[str, int, int, int]


@dataclass(frozen=True)
class FoundComment:
    """A comment where it stands in the file."""

    text: str
    line: int
    column: int
    trailing: bool  # code stands before it on its line


def found_in_tokens(tokens: list[Token], chunk: str, line_offset: int) -> list[FoundComment]:
    """The COMMENT tokens the lexer met in ``chunk``, which starts ``line_offset`` lines into
    the file."""
    found = []
    for token in tokens:
        line_start = chunk.rfind("\n", 0, token.start_pos) + 1
        trailing = bool(chunk[line_start : token.start_pos].strip())
        text = str(token).rstrip()
        found.append(FoundComment(text, token.line + line_offset, token.column, trailing))
    return found


def found_in_comment_lines(chunk: str, line_offset: int) -> list[FoundComment]:
    """The comments of a chunk that holds nothing but comments and blank lines (the parser
    skips it)."""
    found = []
    for number, line in enumerate(chunk.split("\n"), start=line_offset + 1):
        text = line.strip()
        if text.startswith("#"):
            found.append(FoundComment(text, number, line.index("#") + 1, False))
    return found


def attach(
    found: list[FoundComment], layouts: list[list[LineSource]], text: str, path: str
) -> tuple[ast.Comment, ...]:
    """Give each comment its place among the printed lines of the declarations, whose
    ``layouts`` are in the order of the module's declarations.

    A trailing comment ends the printed line holding the code before it; a comment on a line
    of its own goes before the printed line holding the code after it, or, between two
    declarations, before the second (indented ones just below a declaration stay at its end).
    When several comments fall inside the code of one printed line (an expression written
    over several lines), all but the last stand before that line, so their order is kept.
    """
    lines = text.split("\n")
    starts = [layout[0][2] for layout in layouts]
    ends = [max(last for *_, last in layout) for layout in layouts]
    placed: list[ast.Comment] = []
    below: dict[int, int] = {}  # declaration -> line of the last comment kept at its end
    for c in sorted(found, key=lambda c: (c.line, c.column)):
        span = ast.Span(path, c.line, c.column, c.line, c.column + len(c.text))
        k = bisect_right(starts, c.line) - 1
        if k >= 0 and c.line > ends[k] and c.column > 1 and c.line - 1 == below.get(k, ends[k]):
            below[k] = c.line
            placed.append(ast.Comment(c.text, k, ast.AFTER_DECLARATION, span=span))
            continue
        if k < 0 or c.line > ends[k]:
            blank_after = c.line < len(lines) and not lines[c.line].strip()
            placed.append(ast.Comment(c.text, k + 1, blank_after=blank_after, span=span))
            continue
        layout = sorted(layouts[k], key=lambda source: source[2])
        i = bisect_right([first for _, _, first, _ in layout], c.line) - 1
        clause, item, _, last = layout[i]
        if c.line > last:
            # between the code of two printed lines: before the second
            clause, item = layout[i + 1][:2]
            placed.append(ast.Comment(c.text, k, clause, item, span=span))
        else:
            placed.append(ast.Comment(c.text, k, clause, item, c.trailing, span=span))
    return _one_trailing_per_line(placed)


def _one_trailing_per_line(placed: list[ast.Comment]) -> tuple[ast.Comment, ...]:
    """Only the last comment of a printed line can end it; the others go before it."""
    last: dict[tuple[int, str, int], int] = {}
    for index, c in enumerate(placed):
        last[(c.declaration, c.clause, c.item)] = index
    return tuple(
        replace(c, trailing=False)
        if c.trailing and last[(c.declaration, c.clause, c.item)] != index
        else c
        for index, c in enumerate(placed)
    )
