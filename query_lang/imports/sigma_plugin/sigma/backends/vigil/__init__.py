"""pySigma's plugin module for Vigil: ``sigma convert -t vigil`` finds the backend here."""

from __future__ import annotations

from query_lang.imports.sigma.backend import VigilBackend

__all__ = ["VigilBackend"]
