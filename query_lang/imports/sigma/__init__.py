"""Sigma rules in Vigil: a pySigma backend, the log-source mapping, correlation rules as
metrics and sequence rules, and Windows event logs (evtx as JSON) as Vigil events."""

from __future__ import annotations

from query_lang.imports.sigma.backend import VigilBackend, vigil_pipeline
from query_lang.imports.sigma.errors import SigmaImportError
from query_lang.imports.sigma.evtx import EvtxConversion, convert_evtx_json
from query_lang.imports.sigma.importer import SigmaImport, import_sigma
from query_lang.imports.sigma.logsources import LogSourceMap, StreamSpec, vigil_name

__all__ = [
    "EvtxConversion",
    "LogSourceMap",
    "SigmaImport",
    "SigmaImportError",
    "StreamSpec",
    "VigilBackend",
    "convert_evtx_json",
    "import_sigma",
    "vigil_name",
    "vigil_pipeline",
]
