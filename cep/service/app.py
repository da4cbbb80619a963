"""The HTTP API of ``vigil serve`` (FastAPI; the schema at ``/openapi.json``).

Every route but the schema needs a bearer token (:mod:`cep.service.tokens`): ``read`` for the
GETs and ``/check``, ``write`` for changes and ingestion. Each token has a rate limit
(:mod:`cep.service.ratelimit`), each body a size limit. Errors are RFC 9457 problem details
(:mod:`cep.service.problems`). The routes and their answers: ``docs/service.md``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from functools import partial
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from cep.alerts import AlertConfigError
from cep.service.activity import overview
from cep.service.automaton import automaton_dot, automaton_svg
from cep.service.console import console_file
from cep.service.intake import parse_events
from cep.service.problems import PROBLEM_JSON, Problem
from cep.service.ratelimit import RateLimiter
from cep.service.runner import RunnerStopped
from cep.service.service import Service
from cep.service.spark_job import SparkJobError
from cep.service.tokens import Principal, Scope
from cep.service.trial import MAX_LAST, try_text

__all__ = ["create_app"]

PAGE = 100
"""Entries a page of ``/matches`` or ``/dead-letters`` holds unless ``limit`` says."""

MAX_PAGE = 1000

_TEXT_BODY = {"requestBody": {"required": True, "content": {"text/plain": {
    "schema": {"type": "string"}}}}}
_LINES_BODY = {"requestBody": {"required": True, "content": {"application/x-ndjson": {
    "schema": {"type": "string", "description": "one JSON object per line"}}}}}

_bearer = HTTPBearer(auto_error=False, description="an API token: vigil serve token create")


def create_app(service: Service) -> FastAPI:
    """The API of ``service``; starting the app (its lifespan) starts the service."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await run_in_threadpool(service.start)
        try:
            yield
        finally:
            await run_in_threadpool(service.stop)

    app = FastAPI(
        title="Vigil",
        summary="Standing rules, queries and metrics over event streams, changed live.",
        version="1",
        lifespan=lifespan,
        docs_url=None,  # the interactive pages load scripts from a CDN: not on a private API
        redoc_url=None,
    )
    app.state.service = service
    _handlers(app)
    named, runner, match_log = service.named, service.runner, service.match_log
    config = service.config

    async def body_of(request: Request) -> bytes:
        return await _read_body(request, config.max_body)

    async def text_of(request: Request) -> str:
        data = await body_of(request)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Problem(400, "The body is not UTF-8", str(exc), kind="not-utf8") from None

    async def applied(version: int | None, wait: bool) -> dict[str, Any]:
        """Ask the engine to apply a new version; with ``wait``, until it did."""
        if version is None:
            return {"applied_version": runner.applied}
        try:
            future = runner.nudge()
        except RunnerStopped:
            return {"applied_version": runner.applied}
        if wait:
            try:
                await asyncio.wait_for(asyncio.wrap_future(future), 30.0)
            except (TimeoutError, RunnerStopped):
                pass
        return {"applied_version": runner.applied}

    # ------------------------------------------------------------------ the service

    @app.get("/status", summary="The registry version in force, the engine's counters")
    async def status(principal: Reader) -> JSONResponse:
        return JSONResponse({
            "registry_version": service.registry.version,
            "applied_version": runner.applied,
            "apply_error": runner.apply_error,
            "running": runner.running,
            "engine": runner.stats,
            "matches_cursor": await run_in_threadpool(match_log.last_cursor, "matches"),
            "dead_letters_cursor": await run_in_threadpool(match_log.last_cursor,
                                                           "dead_letters"),
            "checkpoint_batch": runner.checkpointed_batch,
            "token": principal.name,
            "scope": principal.scope.value,
        })

    # ------------------------------------------------------------------ standing queries

    @app.get("/queries", summary="Every registered declaration: name, kind, version")
    async def list_queries(
        principal: Reader,
        kind: Annotated[str | None, Query(description="rule, query, metric, stream, list or "
                                                      "webhook")] = None,
    ) -> JSONResponse:
        return JSONResponse(await run_in_threadpool(named.list, kind))

    @app.get("/queries/{name}", summary="One declaration: its text, kind, version")
    async def get_query(name: str, principal: Reader) -> JSONResponse:
        return JSONResponse(await run_in_threadpool(named.get, name))

    @app.get("/queries/{name}/history", summary="Every version of a name: when, who, the text")
    async def query_history(name: str, principal: Reader) -> JSONResponse:
        return JSONResponse(await run_in_threadpool(named.history, name))

    @app.get("/queries/{name}/automaton.dot", summary="A rule's compiled automaton as DOT",
             response_class=Response)
    async def automaton_as_dot(name: str, principal: Reader) -> Response:
        text = await run_in_threadpool(_rule_dot, service, name)
        return Response(text, media_type="text/vnd.graphviz; charset=utf-8")

    @app.get("/queries/{name}/automaton.svg", summary="A rule's compiled automaton drawn as "
             "SVG (Graphviz on the server; 503 without it)", response_class=Response)
    async def automaton_as_svg(name: str, principal: Reader) -> Response:
        text = await run_in_threadpool(_rule_dot, service, name)
        svg = await run_in_threadpool(automaton_svg, text)
        return Response(svg, media_type="image/svg+xml")

    @app.get("/overview", summary="Every rule, query and metric with its streams, version, "
             "severity, notify targets and matches in the last hour and day")
    async def standing_overview(principal: Reader) -> JSONResponse:
        return JSONResponse(await run_in_threadpool(_overview, service))

    @app.post("/try", summary="Run DSL text over pasted or recent events without saving it: "
              "its matches and, for a query, why each event matches")
    async def try_it(request: Request, principal: Reader) -> JSONResponse:
        spec = _trial_of(await body_of(request))
        entries = await run_in_threadpool(service.registry.store.current)
        answer = await run_in_threadpool(partial(
            try_text, spec["text"], entries, service.recent, events=spec["events"],
            stream=spec["stream"], last=spec["last"]))
        return JSONResponse(answer)

    @app.put("/queries/{name}", summary="Create (201) or replace (200) a rule, query or metric",
             openapi_extra=_TEXT_BODY, status_code=201)
    async def put_query(
        name: str,
        request: Request,
        principal: Writer,
        wait: Annotated[bool, Query(description="answer once the engine runs it")] = False,
    ) -> JSONResponse:
        text = await text_of(request)
        code, answer = await run_in_threadpool(named.put, name, text, principal.name)
        changed = answer["status"] != "unchanged"
        answer.update(await applied(answer["registry_version"] if changed else None, wait))
        headers = {"Location": f"/queries/{name}"} if code == 201 else None
        return JSONResponse(answer, status_code=code, headers=headers)

    @app.delete("/queries/{name}", summary="Remove a declaration (409 when others need it)")
    async def delete_query(
        name: str,
        principal: Writer,
        wait: Annotated[bool, Query(description="answer once the engine runs without it")]
        = False,
    ) -> JSONResponse:
        answer = await run_in_threadpool(named.delete, name, principal.name)
        answer.update(await applied(answer["registry_version"], wait))
        return JSONResponse(answer)

    @app.post("/check", summary="Check DSL text against the registered program; store nothing",
              openapi_extra=_TEXT_BODY)
    async def check(request: Request, principal: Reader) -> JSONResponse:
        text = await text_of(request)
        return JSONResponse(await run_in_threadpool(named.check, text, principal.name))

    # ------------------------------------------------------------------ events

    @app.post("/events", summary="Feed JSON lines to the engine; answered once its matches "
              "are durable", openapi_extra=_LINES_BODY)
    async def post_events(
        request: Request,
        principal: Writer,
        stream: Annotated[str | None, Query(description="the stream of every line (else "
                                                        "each line's `stream` field)")] = None,
    ) -> JSONResponse:
        body = await body_of(request)
        pieces = await run_in_threadpool(parse_events, body, stream)
        try:
            future = runner.submit(body, stream, pieces)
        except RunnerStopped as exc:
            raise Problem(503, "The engine is not running", str(exc),
                          kind="engine-stopped") from None
        batch = asyncio.wrap_future(future)
        try:
            # Shielded: a client that goes away does not take the batch's answer with it.
            result = await asyncio.shield(batch)
        except asyncio.CancelledError:
            batch.add_done_callback(partial(_keep_recent_later, service, pieces, stream))
            raise
        except Exception as exc:
            service.recent.lost_batch()  # the engine's positions after it are not known
            if isinstance(exc, RunnerStopped):
                raise Problem(503, "The engine is not running", str(exc),
                              kind="engine-stopped") from None
            if isinstance(exc, SparkJobError):
                raise Problem(503, "The Spark job's stream did not take the events", str(exc),
                              kind="stream-unavailable") from None
            raise
        await run_in_threadpool(service.keep_recent, pieces, stream, result)
        return JSONResponse(result.as_dict())

    @app.get("/events/recent", summary="Events kept for the console: a stream's last ones, or "
             "those at arrival positions (a rule match's `events`)")
    async def recent_events(
        principal: Reader,
        stream: Annotated[str | None, Query(description="the last events of this stream")]
        = None,
        limit: Annotated[int, Query(ge=1, le=MAX_LAST)] = PAGE,
        positions: Annotated[str | None, Query(description="comma-separated arrival "
                                                           "positions")] = None,
    ) -> JSONResponse:
        if positions is not None:
            wanted = _positions_of(positions)
            found = service.recent.at(wanted)
            return JSONResponse({
                "events": [{"position": p, "stream": found[p][0], "event": found[p][1]}
                           for p in wanted if p in found],
                "missing": [p for p in wanted if p not in found],
            })
        if stream is None:
            return JSONResponse(service.recent.describe())
        return JSONResponse({"events": [
            {"position": position, "stream": stream, "event": event}
            for _, position, event in service.recent.last(stream, limit)]})

    # ------------------------------------------------------------------ matches, dead letters

    def page(log: str, key: str):
        async def read(
            principal: Reader,
            after: Annotated[int, Query(ge=0, description="the cursor of the last entry "
                                                          "read")] = 0,
            limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = PAGE,
            name: Annotated[str | None, Query(description="only these (a match's name, a "
                                                          "dead letter's reason)")] = None,
        ) -> JSONResponse:
            rows = await run_in_threadpool(match_log.read, log, after=after, limit=limit,
                                           name=name)
            return JSONResponse({key: rows, "next": rows[-1]["cursor"] if rows else after})
        return read

    def live(log: str, event: str):
        async def follow(
            request: Request,
            principal: Reader,
            after: Annotated[int | None, Query(ge=0, description="start after this cursor "
                                               "(default: Last-Event-ID, else now)")] = None,
            name: Annotated[str | None, Query()] = None,
        ) -> StreamingResponse:
            start = after if after is not None else _last_event_id(request)
            if start is None:
                start = await run_in_threadpool(match_log.last_cursor, log)
            return StreamingResponse(
                _events(service, log, event, start, name),
                media_type="text/event-stream",
                headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            )
        return follow

    app.get("/matches", summary="Matches after a cursor, oldest first")(page("matches",
                                                                              "matches"))

    @app.get("/matches/newest", summary="The newest matches (of a name), oldest first: a "
             "metric's last windows, the matches before following the stream")
    async def newest_matches(
        principal: Reader,
        limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = PAGE,
        name: Annotated[str | None, Query(description="only this rule's, query's or "
                                                      "metric's")] = None,
    ) -> JSONResponse:
        rows = await run_in_threadpool(match_log.newest, "matches", limit=limit, name=name)
        last = rows[-1]["cursor"] if rows else await run_in_threadpool(match_log.last_cursor,
                                                                       "matches")
        return JSONResponse({"matches": rows, "next": last})
    app.get("/matches/stream", summary="Matches as Server-Sent Events (id = cursor)",
            response_class=StreamingResponse)(live("matches", "match"))
    app.get("/dead-letters", summary="Dead letters after a cursor, oldest first")(
        page("dead_letters", "dead_letters"))
    app.get("/dead-letters/stream", summary="Dead letters as Server-Sent Events",
            response_class=StreamingResponse)(live("dead_letters", "dead_letter"))

    # ------------------------------------------------------------------ alerts

    @app.get("/alerts", summary="The alert outbox per endpoint: pending, delivered, failed")
    async def alerts(principal: Reader) -> JSONResponse:
        return JSONResponse(await run_in_threadpool(service.alerts.status))

    @app.post("/alerts/replay", summary="Deliver again the delivered and failed alerts of an "
              "endpoint (or every endpoint) created since a time")
    async def replay_alerts(
        principal: Writer,
        endpoint: Annotated[str | None, Query(description="the webhook (default: every one)")]
        = None,
        since: Annotated[datetime | None, Query(description="ISO 8601 time with a zone "
                                                            "(default: all)")] = None,
    ) -> JSONResponse:
        start = since if since is not None else datetime.fromtimestamp(0, UTC)
        try:
            count = await run_in_threadpool(service.alerts.outbox.replay, start, endpoint)
        except AlertConfigError as exc:
            kind = "not-found" if endpoint is not None and "no endpoint" in str(exc) else \
                "bad-request"
            raise Problem(404 if kind == "not-found" else 400, "Cannot replay", str(exc),
                          kind=kind) from None
        return JSONResponse({"endpoint": endpoint, "since": start.isoformat(),
                             "replayed": count})

    # ------------------------------------------------------------------ the console

    @app.get("/", include_in_schema=False)
    async def console_page() -> Response:
        return _static("index.html")

    @app.get("/console/{file}", include_in_schema=False)
    async def console_asset(file: str) -> Response:
        return _static(file)

    return app


# ---------------------------------------------------------------------- pieces

_CONSOLE_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; "
                   "img-src 'self' blob: data:; connect-src 'self'; form-action 'none'; "
                   "frame-ancestors 'none'; base-uri 'none'")


def _static(file: str) -> Response:
    """A file of the console (package data; 404 for any other name)."""
    found = console_file(file)
    if found is None:
        raise Problem(404, "Not found", f"the console has no file {file[:60]!r}")
    data, media_type = found
    return Response(data, media_type=media_type, headers={
        "Content-Security-Policy": _CONSOLE_POLICY,
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
        "Cache-Control": "no-cache",
    })


def _keep_recent_later(service: Service, pieces: list, stream: str | None,
                       done: asyncio.Future) -> None:
    """Keep the events of a batch whose client went away, once the engine fed it."""
    if done.cancelled() or done.exception() is not None:
        service.recent.lost_batch()
        return
    result = done.result()
    asyncio.get_running_loop().run_in_executor(
        None, service.keep_recent, pieces, stream, result)


def _rule_dot(service: Service, name: str) -> str:
    return automaton_dot(service.registry.program(), name)


def _overview(service: Service) -> dict[str, Any]:
    versions = {e.name: e.version for e in service.registry.store.current()
                if e.space == "standing"}
    answer = overview(service.registry.program(), versions, service.match_log.path)
    answer["registry_version"] = service.registry.version
    return answer


def _positions_of(text: str) -> list[int]:
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or len(parts) > MAX_PAGE or not all(p.isdigit() for p in parts):
        raise Problem(400, "Bad request", f"positions: up to {MAX_PAGE} whole numbers, "
                      "comma-separated", kind="bad-request")
    return [int(p) for p in parts]


def _trial_of(body: bytes) -> dict[str, Any]:
    """The JSON body of ``POST /try``: ``text``, and ``events`` (JSON lines) with ``stream``,
    or ``last``."""
    try:
        spec = json.loads(body)
    except ValueError as exc:
        raise Problem(400, "Bad request", f"the body is not JSON: {exc}",
                      kind="bad-request") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("text"), str):
        raise Problem(400, "Bad request", 'the body is {"text": DSL, "events": JSON lines '
                      '| null, "stream": NAME | null, "last": N}', kind="bad-request")
    events, stream, last = spec.get("events"), spec.get("stream"), spec.get("last", 100)
    if events is not None and not isinstance(events, str):
        raise Problem(400, "Bad request", "events: JSON lines, as one string",
                      kind="bad-request")
    if stream is not None and not isinstance(stream, str):
        raise Problem(400, "Bad request", "stream: a stream's name", kind="bad-request")
    if isinstance(last, bool) or not isinstance(last, int) or not 0 <= last <= MAX_LAST:
        raise Problem(400, "Bad request", f"last: a whole number from 0 to {MAX_LAST}",
                      kind="bad-request")
    return {"text": spec["text"], "events": events, "stream": stream, "last": last}


def _authorize(needed: Scope):
    """The dependency that lets a request through: a known token, its scope, its rate."""

    async def principal_of(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    ) -> Principal:
        service: Service = request.app.state.service
        challenge = {"WWW-Authenticate": 'Bearer realm="vigil"'}
        if credentials is None or credentials.scheme.lower() != "bearer":
            raise Problem(401, "Unauthorized", "send an API token: Authorization: Bearer TOKEN",
                          headers=challenge)
        principal = await run_in_threadpool(service.tokens.authenticate,
                                            credentials.credentials)
        if principal is None:
            raise Problem(401, "Unauthorized", "the token is unknown or revoked",
                          headers={"WWW-Authenticate": 'Bearer realm="vigil", '
                                   'error="invalid_token"'})
        if not principal.scope.allows(needed):
            raise Problem(403, "Forbidden",
                          f"token '{principal.name}' has scope {principal.scope.value}; this "
                          f"needs {needed.value}")
        wait = service.limiter.take(principal.name)
        if wait:
            raise Problem(429, "Too many requests",
                          f"token '{principal.name}' is over its rate limit",
                          headers={"Retry-After": RateLimiter.retry_after(wait)})
        return principal

    return Depends(principal_of)


async def _read_body(request: Request, limit: int) -> bytes:
    too_large = Problem(413, "Body too large", f"a body may hold at most {limit:,} bytes",
                        kind="too-large")
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large
    parts, size = [], 0
    async for part in request.stream():
        size += len(part)
        if size > limit:
            raise too_large
        parts.append(part)
    return b"".join(parts)


def _last_event_id(request: Request) -> int | None:
    value = request.headers.get("last-event-id", "").strip()
    return int(value) if value.isdigit() else None


async def _events(
    service: Service, log: str, event: str, cursor: int, name: str | None
) -> AsyncIterator[str]:
    """Entries of ``log`` after ``cursor`` as Server-Sent Events, then each as it is written;
    a comment every ``ping_s`` while idle keeps proxies from closing the stream."""
    match_log = service.match_log
    yield "retry: 2000\n\n"
    with match_log.notifier.subscribe() as subscription:
        while not service.stopping:
            subscription.arm()
            rows = await run_in_threadpool(match_log.read, log, after=cursor, limit=500,
                                           name=name)
            for row in rows:
                cursor = row["cursor"]
                data = json.dumps(row, ensure_ascii=False, separators=(",", ":"), default=str)
                yield f"id: {cursor}\nevent: {event}\ndata: {data}\n\n"
            if len(rows) == 500:
                continue
            if not await subscription.wait(service.config.ping_s):
                yield ": ping\n\n"


def _handlers(app: FastAPI) -> None:
    def problem(p: Problem) -> JSONResponse:
        return JSONResponse(p.body(), status_code=p.status, headers=p.headers,
                            media_type=PROBLEM_JSON)

    @app.exception_handler(Problem)
    async def on_problem(request: Request, exc: Problem) -> JSONResponse:
        return problem(exc)

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"file": None, "line": None, "column": None,
                   "message": f"{'.'.join(str(p) for p in e.get('loc', ()))}: {e.get('msg')}"}
                  for e in exc.errors()]
        return problem(Problem(400, "Bad request", "the request's parameters are invalid",
                               kind="bad-request", errors=errors))

    @app.exception_handler(Exception)
    async def on_error(request: Request, exc: Exception) -> JSONResponse:
        # A bug, logged with its traceback by the server; the client gets a problem too.
        return problem(Problem(500, "Internal error", f"{type(exc).__name__}: the request "
                               "failed; the service's log says why", kind="internal"))

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return problem(Problem(exc.status_code, _TITLES.get(exc.status_code, "Error"),
                               str(exc.detail) if exc.detail else None,
                               headers=getattr(exc, "headers", None)))


Reader = Annotated[Principal, _authorize(Scope.READ)]
"""A request with a read (or write) token, within its rate."""

Writer = Annotated[Principal, _authorize(Scope.WRITE)]
"""A request with a write token, within its rate."""

_TITLES = {404: "Not found", 405: "Method not allowed", 400: "Bad request"}
