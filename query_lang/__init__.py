"""The Vigil language: grammar, syntax tree, parser, semantic checks, printer."""

from __future__ import annotations

from query_lang import ast
from query_lang.checks import check_declarations
from query_lang.errors import (
    ErrorList,
    IncludeError,
    VigilError,
    VigilLimitError,
    VigilNameError,
    VigilSyntaxError,
    VigilTypeError,
    VigilValueError,
)
from query_lang.loader import Program, check_program, load_program
from query_lang.parser import parse, parse_expr, parse_recovering, parse_search
from query_lang.printer import print_declaration, print_expr, print_module, print_search

__all__ = [
    "ast",
    "parse",
    "parse_expr",
    "parse_recovering",
    "parse_search",
    "check_declarations",
    "check_program",
    "load_program",
    "Program",
    "print_module",
    "print_declaration",
    "print_expr",
    "print_search",
    "VigilError",
    "VigilSyntaxError",
    "VigilNameError",
    "VigilTypeError",
    "VigilValueError",
    "VigilLimitError",
    "IncludeError",
    "ErrorList",
]
