"""Trying a rule, query or metric before it is saved (``POST /try``): the text runs in an
engine of its own, beside the registered streams, lists and webhooks, over events pasted by the
client or the last events posted to its streams (:class:`~cep.service.recent.RecentEvents`).
Nothing of the service changes: no match is logged, no alert is queued."""

from __future__ import annotations

import json
from typing import Any

from cep.engine import Engine
from cep.engine.queries import query_schema
from cep.events.event import BadEventError, StreamSchema
from cep.inputs import EventBatch
from cep.registry import Entry
from cep.service.intake import parse_events
from cep.service.problems import Problem, located
from cep.service.recent import RecentEvents
from percolator import AnalyzedDocument, compile_query
from query_lang import VigilError, ast, parse_recovering

__all__ = ["EXPLAINED", "MAX_LAST", "try_text"]

BODY = "<body>"

MAX_LAST = 1000
"""The most recent events a trial may ask for."""

EXPLAINED = 50
"""Events a query of the trial is explained on, at most (the first ones)."""

_CONTEXT = ("stream", "list", "table", "webhook")


def try_text(
    text: str,
    entries: list[Entry],
    recent: RecentEvents,
    *,
    events: str | None = None,
    stream: str | None = None,
    last: int = 100,
) -> dict[str, Any]:
    """Run ``text`` (DSL) over ``events`` (JSON lines; ``stream`` binds every line) or, without
    them, over the ``last`` events posted to the streams its rules, queries and metrics read.

    ``entries`` is the registry's program: its streams, lists and webhooks are in force unless
    ``text`` declares one of the same name. The answer: the matches, the dead letters, and for
    each query of ``text`` and each of the first :data:`EXPLAINED` events of its streams, why
    it matches or not with its highlights.

    Raises
    ------
    Problem
        400 when ``text`` does not parse or check beside the registered program.
    """
    module, errors = parse_recovering(text, BODY)
    if errors:
        raise Problem(400, "The text does not parse", f"{len(errors)} error(s)",
                      kind="invalid-program", errors=located(errors))
    decls = [d for d in module.declarations if not isinstance(d, ast.Include)]
    if len(decls) != len(module.declarations):
        raise Problem(400, "The text is not self-contained", "include is not accepted over HTTP",
                      kind="invalid-program")
    engine = _engine(module, decls, entries)
    standing = [d for d in decls if isinstance(d, ast.RuleDecl | ast.QueryDecl | ast.MetricDecl)]
    if events is not None:
        # A last line without its newline is an event too (a pasted one often lacks it).
        body, source = events.encode("utf-8"), "pasted"
        if body and not body.endswith(b"\n"):
            body += b"\n"
    else:
        last = max(0, min(int(last), MAX_LAST))
        streams = sorted({s for d in standing for s in d.streams})
        body, source = _recent_lines(recent, streams, last), "recent"
    pieces = parse_events(body, stream if events is not None else None)
    for piece in pieces:
        if isinstance(piece, EventBatch):
            engine.feed_batch(piece.frame, source=piece.source, lines=piece.lines, raw=piece.raw)
        else:
            engine.reject(piece)
    engine.close()  # end of input: windows close, pending absences fire
    received = sum(len(p) if isinstance(p, EventBatch) else 1 for p in pieces)
    answer = {
        "source": source,
        "events": received,
        "names": [d.name for d in standing],
        "matches": engine.drain(),
        "dead_letters": engine.drain_dead_letters(),
        "explain": _explanations(standing, engine, body, stream if events is not None else None),
    }
    if events is None:
        # Why there were so few events, if there were: what the service keeps of each stream.
        kept = recent.describe()
        answer["recent"] = {**kept, "streams": {s: kept["streams"].get(s, 0) for s in streams}}
    return answer


def _engine(module: ast.Module, decls: list[ast.Declaration], entries: list[Entry]) -> Engine:
    """An engine with the registered streams, lists and webhooks ``decls`` does not redefine,
    and ``decls``."""
    own = {(_kind(d), d.name) for d in decls}
    context = "".join(e.text + "\n" for e in entries
                      if e.kind in _CONTEXT and e.text is not None and (e.kind, e.name) not in own)
    engine = Engine()
    try:
        if context:
            engine.register(context)
        engine.register(module)
    except VigilError as err:
        found = list(getattr(err, "errors", None) or [err])
        raise Problem(400, "The text does not check", f"{len(found)} error(s)",
                      kind="invalid-program", errors=located(found)) from None
    return engine


def _kind(decl: ast.Declaration) -> str:
    return {ast.StreamDecl: "stream", ast.ListDecl: "list", ast.TableDecl: "table",
            ast.WebhookDecl: "webhook"}.get(type(decl), "standing")


def _recent_lines(recent: RecentEvents, streams: list[str], last: int) -> bytes:
    """The newest ``last`` events of each of ``streams``, in the order they were posted."""
    kept = [(seq, name, event) for name in streams for seq, _, event in recent.last(name, last)]
    kept.sort(key=lambda item: item[0])
    return "".join(json.dumps({**event, "stream": name}, ensure_ascii=False) + "\n"
                   for _, name, event in kept).encode("utf-8")


def _explanations(standing: list[ast.Declaration], engine: Engine, body: bytes,
                  stream: str | None) -> list[dict[str, Any]]:
    queries = [d for d in standing if isinstance(d, ast.QueryDecl)]
    if not queries:
        return []
    documents = []
    for line in body.decode("utf-8", "replace").splitlines():
        if len(documents) >= EXPLAINED:
            break
        try:
            raw = json.loads(line)
        except ValueError:
            continue
        if isinstance(raw, dict):
            documents.append((len(documents), raw))
    streams = engine.streams
    out = []
    for decl in queries:
        for index, raw in documents:
            name = stream or raw.get("stream")
            if name is None and len(decl.streams) == 1:
                name = decl.streams[0]
            if name not in decl.streams or name not in streams:
                continue
            entry: dict[str, Any] = {"query": decl.name, "event": index, "stream": name,
                                     "document": raw}
            try:
                event = StreamSchema.from_decl(streams[name]).normalise(raw, seq=0, position=0)
            except BadEventError as err:
                entry.update(matched=False, error=str(err))
                out.append(entry)
                continue
            schema = query_schema(streams[name])
            compiled = compile_query(decl.match, schema)
            doc = AnalyzedDocument(event.fields, schema)
            matched = compiled.matches(doc)
            entry.update(matched=matched, explain=compiled.explain(doc),
                         highlights=compiled.highlights(doc) if matched else {})
            out.append(entry)
    return out
