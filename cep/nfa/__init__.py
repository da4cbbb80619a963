"""Sequence rules as automata: the compiler (an immutable, shared NFA per rule), the per-key
runtime and its state bytes, the column-wise strict scan, the keyed rule processor, and the
explanation of a compiled automaton."""

from __future__ import annotations

from cep.nfa.compiler import CompiledRule, compile_rule
from cep.nfa.errors import RuleCompileError
from cep.nfa.explain import describe, to_dot
from cep.nfa.match import Match
from cep.nfa.processor import RuleProcessor
from cep.nfa.runtime import RuleState, advance_watermark, new_state, process_event

__all__ = [
    "CompiledRule",
    "Match",
    "RuleCompileError",
    "RuleProcessor",
    "RuleState",
    "advance_watermark",
    "compile_rule",
    "describe",
    "new_state",
    "process_event",
    "to_dot",
]
