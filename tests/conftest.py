"""Shared fixtures: a real redis-server for the whole run, flushed between tests; and no
test passes while the gateway logged a traceback during it."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.redis_server import RedisServer

# Loggers whose tracebacks are ours: an exception that escaped a handler is a bug even
# when the client saw a clean close (websockets logs a handler's exception as its own).
_OURS = ("gateway", "websockets")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "logs_traceback: the test makes the gateway log an exception with its traceback "
        "on purpose (it checks that the failure is reported)",
    )


class LoggedTracebacks(logging.Handler):
    """ERROR records of our loggers that carry a traceback (``exc_info`` or its text)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.name.split(".")[0] not in _OURS:
            return
        if record.exc_info or "Traceback (most recent call last)" in record.getMessage():
            self.records.append(record)

    def report(self) -> str:
        formatter = logging.Formatter("%(name)s: %(message)s")
        return "\n\n".join(formatter.format(r) for r in self.records)


@pytest.fixture(autouse=True)
def logged_tracebacks(request: pytest.FixtureRequest) -> Iterator[LoggedTracebacks]:
    """Fails the test if the gateway logged a traceback in this process during it.

    In-process gateways (``gateway.app.running_gateway``) log to the root
    logger; a test that provokes one on purpose says so with
    ``@pytest.mark.logs_traceback`` and may read ``records``.
    """
    handler = LoggedTracebacks()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
    if handler.records and request.node.get_closest_marker("logs_traceback") is None:
        pytest.fail("the gateway logged a traceback:\n" + handler.report(), pytrace=False)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(Path(tmp_path_factory.mktemp("redis")))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """A Redis URL with an empty database for this test."""
    import redis

    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    yield redis_server.url
