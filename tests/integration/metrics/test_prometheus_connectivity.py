"""Reaching a Prometheus as real deployments put it: TLS with a private CA, a tenant header,
a global view of many clusters (issue [M] item 9), through ``spectune diagnose``.

The TLS case runs a real Prometheus serving https with a certificate of a throwaway CA made
by ``openssl``; the header and cluster case uses a loopback listener that records what
arrives (Prometheus does not echo request headers back), over real sockets.
"""

from __future__ import annotations

import json
import shutil
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from spectune.exitcodes import ExitCode
from tests.fixtures.prometheus import free_port
from tests.fixtures.recording import RecordingServer

REPO = Path(__file__).resolve().parents[3]
_EMPTY = b'{"status":"success","data":{"resultType":"vector","result":[]}}'


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spectune", *args], capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(REPO / "operator"), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def _certificates(d: Path) -> None:
    """A CA and a server certificate for 127.0.0.1 signed by it (ca.crt, server.crt/.key)."""
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out",
             "ca.crt", "-days", "2", "-subj", "/CN=spectune test CA",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out",
             "server.csr", "-subj", "/CN=127.0.0.1", cwd=d)  # fmt: skip
    (d / "ext.cnf").write_text(
        "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
    )
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", "server.crt", "-days", "2", "-extfile", "ext.cnf",
             cwd=d)  # fmt: skip


@pytest.fixture(scope="module")
def tls_prometheus() -> Iterator[tuple[str, Path]]:
    """A real Prometheus on https://127.0.0.1:PORT; yields its URL and the CA file."""
    binary = shutil.which("prometheus")
    if binary is None or shutil.which("openssl") is None:
        pytest.fail("the prometheus and openssl binaries must be on PATH (bash hack/test.sh)")
    d = Path(tempfile.mkdtemp(prefix="spectune-prom-tls-"))
    _certificates(d)
    (d / "web.yml").write_text(
        f"tls_server_config:\n  cert_file: {d / 'server.crt'}\n  key_file: {d / 'server.key'}\n"
    )
    (d / "prometheus.yml").write_text("global:\n  scrape_interval: 15s\n")
    port = free_port()
    with (d / "prometheus.log").open("ab") as log:
        proc = subprocess.Popen(
            [binary, f"--config.file={d / 'prometheus.yml'}",
             f"--storage.tsdb.path={d / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
             f"--web.config.file={d / 'web.yml'}", "--log.level=warn"],
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    url = f"https://127.0.0.1:{port}"
    trust = ssl.create_default_context(cafile=d / "ca.crt")
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/-/ready", verify=trust, timeout=2).is_success:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or proc.poll() is not None:
                pytest.fail(f"TLS Prometheus not ready: {(d / 'prometheus.log').read_text()}")
            time.sleep(0.3)
        yield url, d / "ca.crt"
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(d, ignore_errors=True)


def _diagnose(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return _cli("diagnose", "--prometheus", url, "--selector", '{namespace="llm"}',
                "--window", "60s", "--timeout", "5", *extra)  # fmt: skip


def test_a_private_ca_is_trusted_only_when_given(tls_prometheus: tuple[str, Path]) -> None:
    url, ca = tls_prometheus
    # Without the CA: refused on one line that names the fix, exit "unreachable".
    plain = _diagnose(url)
    assert plain.returncode == ExitCode.UNREACHABLE, plain.stderr
    lines = plain.stderr.strip().splitlines()
    assert len(lines) == 1 and "its TLS certificate is not trusted" in lines[0], lines
    assert "--ca-file" in lines[0] and "Traceback" not in plain.stderr
    # With it, or with the check skipped, the query is answered: this Prometheus scrapes no
    # engine, which is "no data" (exit 5), past TLS.
    for extra in (("--ca-file", str(ca)), ("--insecure-skip-verify",)):
        proc = _diagnose(url, *extra)
        assert proc.returncode == ExitCode.NO_DATA, (extra, proc.stderr)
        assert "matches no serving-engine series" in proc.stderr
    # A file that is not a CA bundle is bad input, before any query.
    bad = _diagnose(url, "--ca-file", str(ca.with_name("web.yml")))
    assert bad.returncode == ExitCode.BAD_INPUT and "not PEM certificates" in bad.stderr


def test_tenant_header_and_cluster_matcher_go_with_every_query() -> None:
    rec = RecordingServer(_EMPTY)
    try:
        proc = _diagnose(rec.url, "--header", "X-Scope-OrgID: team-a", "--cluster", "eu-west-1")
    finally:
        rec.close()
    assert proc.returncode == ExitCode.NO_DATA, proc.stderr
    assert len(rec.seen) >= 3  # the dialect probes, one per engine
    for message, query in rec.seen:
        headers = dict(message)
        assert headers.get("X-Scope-OrgID") == "team-a", headers
        assert f"cluster={json.dumps('eu-west-1')}" in query, query
        assert 'namespace="llm"' in query
    # The message names the selector as queried, the cluster included.
    assert '{namespace="llm",cluster="eu-west-1"}' in proc.stderr
