"""``vigil serve``: the registry of standing queries, the embedded engine and its matches over
HTTP — changes applied live between event batches, matches durable before a post is answered,
bearer tokens with scopes and rate limits (:mod:`cep.service.app` and the modules it uses)."""

from typing import TYPE_CHECKING

from cep.service.matchlog import MatchLog
from cep.service.ratelimit import RateLimiter
from cep.service.runner import EngineRunner, IngestResult
from cep.service.service import Service, ServiceConfig, ServiceError
from cep.service.tokens import Principal, Scope, TokenError, TokenStore

__all__ = [
    "EngineRunner",
    "IngestResult",
    "MatchLog",
    "Principal",
    "RateLimiter",
    "Scope",
    "Service",
    "ServiceConfig",
    "ServiceError",
    "TokenError",
    "TokenStore",
    "create_app",
]

if TYPE_CHECKING:
    from cep.service.app import create_app


def __getattr__(name: str):
    # The web framework takes a second to import: only `vigil serve` itself pays for it, not
    # `vigil serve token ...` nor the other commands.
    if name == "create_app":
        from cep.service.app import create_app

        return create_app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
