"""Fixtures of the service tests (helpers: ``service_support``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from service_support import Api, LiveServer, in_process_client, make_service

from cep.service import create_app


@pytest.fixture
def api_factory(tmp_path):
    """``api_factory(**ServiceConfig options)``: a started service and its client."""
    opened = []

    def factory(**options) -> Api:
        service = make_service(tmp_path, **options)
        write = service.tokens.create("ana", "write")
        read = service.tokens.create("bo", "read")
        client = in_process_client(create_app(service))
        client.__enter__()
        opened.append(client)
        return Api(client, service, write, read)

    yield factory
    for client in opened:
        client.__exit__(None, None, None)


@pytest.fixture
def api(api_factory) -> Api:
    return api_factory()


@pytest.fixture
def live_factory(tmp_path) -> Iterator:
    servers = []

    def factory(**options):
        service = make_service(tmp_path, **options)
        write = service.tokens.create("ana", "write")
        read = service.tokens.create("bo", "read")
        server = LiveServer(service)
        servers.append(server)
        return server, {"Authorization": f"Bearer {write}"}, {"Authorization": f"Bearer {read}"}

    yield factory
    for server in servers:
        server.stop()
