"""The web console of ``vigil serve``: static HTML, CSS and JavaScript shipped as package data
and served at ``/`` and ``/console/FILE``. The page calls the public API only, with the token
the user signs in with (kept in the tab's ``sessionStorage``)."""

from __future__ import annotations

from importlib import resources

__all__ = ["FILES", "console_file"]

FILES = {
    "index.html": "text/html; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "highlight.js": "text/javascript; charset=utf-8",
}
"""The console's files and their media types; no other name is served."""


def console_file(name: str) -> tuple[bytes, str] | None:
    """The bytes and media type of the console's file ``name``, or ``None``."""
    media_type = FILES.get(name)
    if media_type is None:
        return None
    return resources.files(__name__).joinpath(name).read_bytes(), media_type
