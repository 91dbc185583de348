"""PrometheusSource against hostile HTTP servers on loopback (real sockets, real requests).

A SpecTuning's URL may point anywhere the operator reaches; these servers answer what such a
URL could: secrets in an error body, a redirect elsewhere, refused credentials, JSON that is
not Prometheus'. The source must tell them apart by status, repeat none of the body, and
never carry the credentials on.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from spectune.errors import QueryRejectedError, SourceUnavailableError, UnauthorizedError
from spectune.metrics import PrometheusSource
from tests.fixtures.recording import RecordingServer

SECRET = "db-password-hunter2"
AUTH = {"Authorization": "Bearer tok-xyz"}


Serve = Callable[..., RecordingServer]


@pytest.fixture
def serve() -> Iterator[Serve]:
    """Loopback servers answering ``(status, body, headers)``; closed after the test."""
    made: list[RecordingServer] = []

    def make(status: int, body: bytes, headers: dict[str, str] | None = None) -> RecordingServer:
        made.append(RecordingServer(body, status, headers or {}))
        return made[-1]

    yield make
    for s in made:
        s.close()


def _query(url: str) -> BaseException:
    source = PrometheusSource(url, '{namespace="llm"}', headers=AUTH, timeout_s=3)
    with pytest.raises(SourceUnavailableError) as err:
        asyncio.run(source.observe(60))
    return err.value


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (500, f"internal error 400 bad_data; {SECRET}".encode(), SourceUnavailableError),
        (401, f"<html>{SECRET}</html>".encode(), UnauthorizedError),
        (400, b'{"status":"error","errorType":"bad_data","error":"%s"}' % SECRET.encode(),
         QueryRejectedError),
        (200, b'{"foo": 1}', SourceUnavailableError),
        (200, f'{{"status":"success","data":"{SECRET}"}}'.encode(), SourceUnavailableError),
    ],
)  # fmt: skip
def test_each_answer_is_its_own_error_and_repeats_nothing_of_the_body(
    serve: Serve, status: int, body: bytes, error: type[Exception]
) -> None:
    server = serve(status, body)
    exc = _query(server.url)
    assert type(exc) is error, exc
    assert SECRET not in str(exc), exc
    assert server.seen and server.seen[0][0].get("Authorization") == AUTH["Authorization"]


def test_a_redirect_is_not_followed_so_credentials_go_nowhere_else(serve: Serve) -> None:
    elsewhere = serve(200, b'{"status":"success","data":{"resultType":"vector","result":[]}}')
    front = serve(302, b"", {"Location": f"{elsewhere.url}/api/v1/query?query=x"})
    exc = _query(front.url)
    assert "redirect" in str(exc), exc
    assert front.seen and not elsewhere.seen, elsewhere.seen


def test_the_cli_quotes_prometheus_own_error_text_on_one_line(serve: Serve) -> None:
    """The CLI's user chose the URL and reads their own terminal: Prometheus' `error`
    field is quoted there (and only there), on one line."""
    body = b'{"status":"error","errorType":"bad_data","error":"parse error: bad regex\\nline2"}'
    server = serve(400, body)
    cli = subprocess.run(
        [sys.executable, "-m", "spectune.cli", "diagnose", "--prometheus", server.url,
         "--selector", '{namespace="llm"}', "--window", "60s"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert cli.returncode == 4 and "Traceback" not in cli.stderr  # unreachable (exitcodes)
    lines = cli.stderr.strip().splitlines()
    assert len(lines) == 1 and "parse error: bad regex" in lines[0], lines
