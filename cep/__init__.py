"""Complex event processing, one concept per sub-package: ``events`` (validation, event time,
intake), ``nfa`` (rules as automata), ``metrics`` (windowed aggregates), ``alerts`` (webhook
delivery), ``engine`` (the embedded engine) and ``cli`` (the ``vigil`` command); see
``docs/architecture.md``. The names below are the public API."""

from __future__ import annotations

from cep.engine import Engine, EngineStats
from cep.errors import (
    BadEventError,
    CheckpointError,
    EngineError,
    StateError,
    UnknownRuleError,
)
from cep.events import Event, KeyedProcessor, ProcessResult
from cep.metrics import MetricOperator, compile_metric
from cep.nfa import (
    CompiledRule,
    Match,
    RuleProcessor,
    RuleState,
    advance_watermark,
    compile_rule,
    new_state,
    process_event,
)

__all__ = [
    "Engine",
    "EngineStats",
    "Event",
    "EngineError",
    "BadEventError",
    "CheckpointError",
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
