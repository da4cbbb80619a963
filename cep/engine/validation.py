"""What the engine would refuse in a program the language's checks pass: ``vigil check``,
``vigil run`` and the registry accept exactly the same programs."""

from __future__ import annotations

from cep.engine.engine import Engine
from query_lang import Program, VigilError

__all__ = ["compile_errors"]


def compile_errors(program: Program) -> list[VigilError]:
    """The errors of compiling ``program`` as the engine compiles it (every rule, query and
    metric, every list file read), each with its source line attached; ``[]`` when it runs.

    The checks report the compile limits themselves (:mod:`query_lang.limits`); this catches
    whatever a compiler of a layer above the language refuses."""
    try:
        Engine().register(program.modules)
    except VigilError as err:
        found = getattr(err, "errors", None) or [err]
        for each in found:
            if each.source is None and each.span is not None:
                each.source = program.sources.get(each.span.file)
        return found
    return []
