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
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from cep.service.intake import parse_events
from cep.service.problems import PROBLEM_JSON, Problem
from cep.service.ratelimit import RateLimiter
from cep.service.runner import RunnerStopped
from cep.service.service import Service
from cep.service.tokens import Principal, Scope

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
            result = await asyncio.wrap_future(future)
        except RunnerStopped as exc:
            raise Problem(503, "The engine is not running", str(exc),
                          kind="engine-stopped") from None
        return JSONResponse(result.as_dict())

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

    return app


# ---------------------------------------------------------------------- pieces


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
