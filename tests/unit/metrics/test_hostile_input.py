"""Metric input an attacker or a broken engine can send: errors told apart by status, not
text; no body repeated; pages bounded in size; NaN and infinite counters refused; resets said.

HTTP answers are fakes (``answer`` is fed status and body directly; the pod scraper gets an
``httpx.MockTransport``), so nothing here touches a network.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator

import httpx
import pytest

from spectune.diagnose import diagnose
from spectune.engines import Dialect, catalogue_for
from spectune.errors import (
    InputError,
    QueryRejectedError,
    SourceUnavailableError,
    UnauthorizedError,
)
from spectune.metrics import PodScrapeSource, observation_from_pages, parse_page, scrape
from spectune.metrics import prometheus as prom
from spectune.metrics.prometheus import answer
from tests.unit.metrics.test_windows import vllm_page

URL = "http://prom:9090"
SECRET = "internal-admin-password-123"


def _err(kind: str, text: str = SECRET) -> bytes:
    return json.dumps({"status": "error", "errorType": kind, "error": text}).encode()


# -- Prometheus errors by HTTP status and errorType (issue O item 6) ---------------------------


@pytest.mark.parametrize(
    ("status", "body", "error"),
    [
        (401, b"Unauthorized", UnauthorizedError),
        (403, _err("bad_data"), UnauthorizedError),
        (400, _err("bad_data"), QueryRejectedError),
        # a 400 that is not the API's bad_data (a proxy's) is not the query's fault
        (400, b"400 Bad Request", SourceUnavailableError),
        # "400" and "bad_data" in the text of a 500 no longer make it a rejected query
        (500, b"upstream said 400 bad_data", SourceUnavailableError),
        (503, _err("unavailable"), SourceUnavailableError),
        (503, _err("timeout"), SourceUnavailableError),
        (422, _err("execution"), SourceUnavailableError),
        (499, _err("canceled"), SourceUnavailableError),
        (500, _err("internal"), SourceUnavailableError),
        (429, b"slow down", SourceUnavailableError),
        (302, b"", SourceUnavailableError),
        (404, b"<html>not found</html>", SourceUnavailableError),
        (200, b"<html>login</html>", SourceUnavailableError),
        (200, b'{"status": "success", "data": {"result": 7}}', SourceUnavailableError),
        (200, b'{"foo": 1}', SourceUnavailableError),
    ],
)
def test_prometheus_errors_are_classified_by_status_and_error_type(
    status: int, body: bytes, error: type[Exception]
) -> None:
    """Each answer raises its own class, every one temporary (a subclass of
    SourceUnavailableError: the loop holds and retries), never the permanent InputError
    a 500 that mentions "400" used to become."""
    with pytest.raises(SourceUnavailableError) as err:
        answer(status, body, URL)
    assert type(err.value) is error, err.value
    assert not isinstance(err.value, InputError)


@pytest.mark.parametrize("status", [200, 400, 401, 404, 500, 503])
def test_no_error_repeats_what_the_url_answered(status: int) -> None:
    """The URL may be any address the operator reaches; what it answered must not reach a
    status that the SpecTuning's author reads. Only a known errorType is named."""
    for body in (_err("bad_data"), SECRET.encode(), f'{{"x": "{SECRET}"}}'.encode()):
        with pytest.raises(SourceUnavailableError) as err:
            answer(status, body, URL)
        assert SECRET not in str(err.value)
    with pytest.raises(SourceUnavailableError) as err:
        answer(503, json.dumps({"status": "error", "errorType": SECRET}).encode(), URL)
    assert SECRET not in str(err.value)


def test_the_cli_quotes_prometheus_own_error_on_one_line() -> None:
    with pytest.raises(QueryRejectedError) as err:
        answer(400, _err("bad_data", 'parse error: bad regex "("\nmore'), URL, quote=True)
    msg = str(err.value)
    assert 'parse error: bad regex "("' in msg and "\n" not in msg and "more" not in msg


def test_a_success_answer_gives_its_rows() -> None:
    body = {"status": "success", "data": {"resultType": "vector", "result": [{"value": [1, "2"]}]}}
    assert answer(200, json.dumps(body).encode(), URL) == [{"value": [1, "2"]}]


# -- NaN and infinite counters, counter resets (issue O item 8) -------------------------------


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf"])
def test_a_nan_or_infinite_counter_on_a_page_is_bad_input(value: str) -> None:
    """Read as a delta it gave a NaN (or infinite) acceptance; it is a corrupt page."""
    before = parse_page(vllm_page(1000, [800, 500]), "pod-a")
    text = vllm_page(3000, [2400, 1400]).replace(
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 3000',
        f'vllm:spec_decode_num_drafts_total{{engine="0",model_name="m"}} {value}',
    )
    after = parse_page(text, "pod-a")
    with pytest.raises(InputError) as err:
        observation_from_pages([before], [after], 60)
    msg = str(err.value)
    assert "pod-a" in msg and "vllm:spec_decode_num_drafts_total" in msg
    assert "never NaN or infinite" in msg


def test_a_nan_histogram_count_is_bad_input() -> None:
    before = parse_page(vllm_page(1000, [800], tpot=(1.0, 10)), "pod-a")
    text = vllm_page(2000, [1600], tpot=(2.0, 20)).replace(
        'vllm:request_time_per_output_token_seconds_count{engine="0",model_name="m"} 20',
        'vllm:request_time_per_output_token_seconds_count{engine="0",model_name="m"} NaN',
    )
    with pytest.raises(InputError, match="request_time_per_output_token_seconds_count"):
        observation_from_pages([before], [parse_page(text, "pod-a")], 60)


def _range_rows(values: list[str], name: str = "vllm:spec_decode_num_drafts_total") -> list:  # type: ignore[type-arg]
    return [
        {
            "metric": {"__name__": name, "pod": "llama-0", "engine": "0", "model_name": "m"},
            "values": [[1000 + 15 * i, v] for i, v in enumerate(values)],
        },
        {
            "metric": {"__name__": "vllm:num_requests_running", "pod": "llama-0"},
            "values": [[1000, "NaN"], [1015, "3"]],
        },
    ]


def test_an_infinite_counter_in_prometheus_is_bad_input() -> None:
    cat = catalogue_for(Dialect.VLLM_V1)
    with pytest.raises(InputError, match=r"llama-0.*never NaN or infinite"):
        prom._pages_from_ranges(_range_rows(["10", "+Inf", "30"]), Dialect.VLLM_V1, 60, cat)


def test_a_counter_reset_in_prometheus_is_recorded_and_a_nan_gauge_is_still_skipped() -> None:
    cat = catalogue_for(Dialect.VLLM_V1)
    *_, resets = prom._pages_from_ranges(_range_rows(["10", "20"]), Dialect.VLLM_V1, 60, cat)
    assert resets == ()
    _, after, _, resets = prom._pages_from_ranges(
        _range_rows(["500", "900", "40", "80"]), Dialect.VLLM_V1, 60, cat
    )
    assert resets == ("llama-0",)
    assert after[0].total("vllm:num_requests_running") == 3.0


def test_a_counter_reset_is_stated_in_the_diagnosis() -> None:
    """The window of a pod that restarted counts from zero after the restart; the user is
    told so (a note in `spectune diagnose`, and `counter_resets` in its JSON)."""
    before = parse_page(vllm_page(50_000, [40_000, 30_000], tpot=(9.0, 500)), "pod-a")
    after = parse_page(vllm_page(1000, [700, 400], tpot=(1.0, 50)), "pod-a")
    d = diagnose(observation_from_pages([before], [after], 60), draft_cost=0.1)
    assert d.to_json()["counter_resets"] == ["pod-a"]
    assert any("counter reset" in n and "pod-a" in n for n in d.notes), d.notes


# -- scraped pages: bounded, streamed, parsed off the event loop --------------------------------


class _Stream(httpx.AsyncByteStream):
    """An endless metrics page (a fake pod), counting what the scraper pulled from it."""

    def __init__(self) -> None:
        self.pulled = 0

    async def __aiter__(self) -> Iterator[bytes]:  # type: ignore[override]
        line = b'vllm:num_requests_running{model_name="m"} 1\n' * 1000
        while True:
            self.pulled += len(line)
            yield line


async def test_a_page_larger_than_the_limit_is_refused_without_reading_it_whole() -> None:
    stream = _Stream()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=stream)

    limit = 64 * 1024
    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        src = PodScrapeSource(["http://10.0.0.7:8000/metrics"], client=client, max_bytes=limit)
        with pytest.raises(SourceUnavailableError) as err:
            await src.scrape()
    msg = str(err.value)
    assert "http://10.0.0.7:8000/metrics" in msg and str(limit) in msg
    assert "SPECTUNE_SCRAPE_MAX_BYTES" in msg
    assert stream.pulled < 2 * limit, "the page was read on past the limit"


async def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    stream = _Stream()

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, stream=stream, headers={"Content-Length": "999999999"})

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        src = PodScrapeSource(["http://a/metrics"], client=client, max_bytes=4096)
        with pytest.raises(SourceUnavailableError, match="larger than 4096 bytes"):
            await src.scrape()
    assert stream.pulled == 0


async def test_pages_are_parsed_off_the_event_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parsing a page costs CPU in proportion to its size: it runs in a worker thread, so
    the event loop serving every other SpecTuning keeps turning."""
    threads: list[threading.Thread] = []
    real = scrape.parse_page

    def spy(text: str, pod: str) -> object:
        threads.append(threading.current_thread())
        return real(text, pod)

    monkeypatch.setattr(scrape, "parse_page", spy)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, text=vllm_page(100, [80]))

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as client:
        pages, _ = await PodScrapeSource(["http://a/metrics"], client=client).scrape()
    assert pages and threads and threads[0] is not threading.main_thread()
    assert asyncio.get_running_loop()  # the test itself ran on the loop's thread
