"""What each standing query did, from the match log: how many matches in the last hour and the
last day, and when the last one was — the columns of the console's table (``GET /overview``).

Times are event times (a match's ``end``), counted back from the newest match of the log: a
replay of old events reads as it did live, and the figures do not depend on the server's clock.
"""

from __future__ import annotations

import sqlite3
from datetime import datetime, timedelta
from typing import Any

from query_lang import Program, ast

__all__ = ["match_activity", "overview"]

_ISO = "%Y-%m-%dT%H:%M:%S.%f"


def match_activity(path: str) -> tuple[str | None, dict[str, dict[str, Any]]]:
    """(the newest match's end time, per name: ``{total, hour, day, last_match}``) of the match
    log at ``path`` (:class:`cep.service.matchlog.MatchLog`'s file)."""
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
    try:
        db.execute("PRAGMA query_only=1")
        [newest] = db.execute(
            "SELECT max(json_extract(body, '$.end')) FROM matches").fetchone()
        if newest is None:
            return None, {}
        hour, day = _before(newest, hours=1), _before(newest, hours=24)
        rows = db.execute(
            "SELECT name, count(*), sum(json_extract(body, '$.end') > ?),"
            " sum(json_extract(body, '$.end') > ?), max(json_extract(body, '$.end'))"
            " FROM matches GROUP BY name", (hour, day)).fetchall()
    finally:
        db.close()
    return newest, {name: {"total": total, "hour": int(in_hour or 0), "day": int(in_day or 0),
                           "last_match": last}
                    for name, total, in_hour, in_day, last in rows}


def overview(program: Program, versions: dict[str, int], path: str) -> dict[str, Any]:
    """Every rule, query and metric of ``program`` with its stream(s), registry version
    (``versions``), severity, notify targets and match activity."""
    newest, activity = match_activity(path)
    rows = []
    standing: list[tuple[str, ast.Declaration]] = [
        *(("rule", d) for d in program.rules.values()),
        *(("query", d) for d in program.queries.values()),
        *(("metric", d) for d in program.metrics.values()),
    ]
    for kind, decl in standing:
        seen = activity.get(decl.name, {})
        rows.append({
            "name": decl.name,
            "kind": kind,
            "streams": list(decl.streams),
            "version": versions.get(decl.name),
            "severity": decl.severity,
            "notify": list(decl.notify),
            "description": decl.description,
            "matches_hour": seen.get("hour", 0),
            "matches_day": seen.get("day", 0),
            "matches_total": seen.get("total", 0),
            "last_match": seen.get("last_match"),
        })
    rows.sort(key=lambda row: row["name"])
    return {"as_of": newest, "queries": rows}


def _before(iso: str, *, hours: int) -> str:
    """``iso`` (``...Z``, milliseconds) minus ``hours``, in the same form (so that the strings
    compare as the times do)."""
    at = datetime.strptime(iso.rstrip("Z"), _ISO) - timedelta(hours=hours)
    return at.strftime(_ISO)[:23] + "Z"
