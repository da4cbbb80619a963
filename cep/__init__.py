"""Complex event processing: the NFA compiler and runtime, windowed metrics, the embedded
engine, alert delivery and the ``vigil`` command line."""

from __future__ import annotations

from cep.engine.engine import Engine, EngineStats
from cep.events.event import BadEventError, EngineError, Event, StateError, UnknownRuleError
from cep.events.keyed import KeyedProcessor, ProcessResult
from cep.metrics.operator import MetricOperator, compile_metric
from cep.nfa.compiler import CompiledRule, compile_rule
from cep.nfa.match import Match
from cep.nfa.processor import RuleProcessor
from cep.nfa.runtime import RuleState, advance_watermark, new_state, process_event

__all__ = [
    "Engine",
    "EngineStats",
    "Event",
    "EngineError",
    "BadEventError",
    "StateError",
    "UnknownRuleError",
    "KeyedProcessor",
    "ProcessResult",
    "RuleProcessor",
    "Match",
    "CompiledRule",
    "compile_rule",
    "RuleState",
    "new_state",
    "process_event",
    "advance_watermark",
    "MetricOperator",
    "compile_metric",
]
