"""The embedded engine: program loading, intake of events (one by one or column-wise), the
rules, metrics and standing queries run over them, and the matches and dead letters out."""

from __future__ import annotations

from cep.engine.checkpoint import Checkpoint, CheckpointStore, RestoreReport
from cep.engine.engine import Engine, EngineStats
from cep.engine.program import load_declarations, load_list
from cep.engine.queries import StandingQueries

__all__ = [
    "Checkpoint",
    "CheckpointStore",
    "Engine",
    "EngineStats",
    "RestoreReport",
    "StandingQueries",
    "load_declarations",
    "load_list",
]
