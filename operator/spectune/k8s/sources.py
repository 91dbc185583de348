"""The metric sources a SpecTuning names, built from its spec and the cluster.

The tuning loop (``k8s/tuning.py``) asks here for the target's and the canary's sources:

* ``spec.metrics.prometheus``: :class:`~spectune.metrics.PrometheusSource` with the target's
  or canary's selector (``k8s/series.py``), authenticated from ``authSecretRef`` when set
  (:func:`prometheus_headers`: a bearer token, or basic auth from a Secret of type
  ``kubernetes.io/basic-auth``), with ``headers`` added to every request, ``cluster`` added
  to every selector, and the certificate checked as ``tls`` says (:func:`prometheus_tls`);

Credentials confinement. The operator can read Secrets its users may not, so a SpecTuning
must not be able to make it send one anywhere (a confused deputy: ``authSecretRef`` naming
any Secret of the namespace, ``url`` naming the author's own listener). Three rules hold:

1. only a Secret labelled ``spectune.io/prometheus-credentials: "true"`` is used (for
   credentials, and for the CA bundle of ``tls.caSecretRef`` alike); the label
   is checked on the Secret as read, before any of its data is looked at, and a Secret
   that is missing or not labelled gets one and the same message (so a SpecTuning cannot
   probe which Secrets exist);
2. a Secret annotated ``spectune.io/prometheus-url: <url>`` is sent only to that URL
   (compared by scheme, host, port and path; requests never follow a redirect);
3. with ``SPECTUNE_PROMETHEUS_URL_ALLOWLIST`` set, ``spec.metrics.prometheus.url`` must be
   one of its URLs or below one (:func:`check_url_allowed`), credentials or not.

No message repeats a Secret's keys or values, or what a URL answered.
* ``spec.metrics.scrape``: :class:`PodsScrapeSource`, which lists the Deployment's serving
  pods for every window and scrapes their metrics page with
  :class:`~spectune.metrics.PodScrapeSource` (two scrapes, the window apart).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any
from urllib.parse import urlsplit

import httpx
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from spectune.api.spec import PrometheusTLS, ScrapeMetrics, SecretKeyRef
from spectune.errors import InputError, NoDataError, SpecError
from spectune.k8s.actuator import api_error
from spectune.k8s.connect import read_json
from spectune.metrics.observation import Observation
from spectune.metrics.prometheus import tls_context
from spectune.metrics.scrape import MAX_PAGE_BYTES, PodScrapeSource

__all__ = [
    "ANNOTATION_PROMETHEUS_URL",
    "BASIC_AUTH",
    "LABEL_CREDENTIALS",
    "AuthSecretError",
    "PodsScrapeSource",
    "auth_headers",
    "check_url_allowed",
    "pod_ready",
    "pod_urls",
    "prometheus_headers",
    "prometheus_tls",
    "same_url",
    "url_allowed",
]

Obj = dict[str, Any]
BASIC_AUTH = "kubernetes.io/basic-auth"
"""The Secret type whose ``username`` and ``password`` keys give HTTP basic authentication."""

LABEL_CREDENTIALS = "spectune.io/prometheus-credentials"
"""The label (value ``"true"``) by which a Secret opts in to being used for Prometheus."""
ANNOTATION_PROMETHEUS_URL = "spectune.io/prometheus-url"
"""The annotation naming the one Prometheus URL a credentials Secret may be sent to."""

_FIELD = "spec.metrics.prometheus.authSecretRef"
_URL_FIELD = "spec.metrics.prometheus.url"
_CA_FIELD = "spec.metrics.prometheus.tls.caSecretRef"
_ALLOWLIST = "SPECTUNE_PROMETHEUS_URL_ALLOWLIST (chart value operator.prometheusUrlAllowlist)"


class AuthSecretError(SpecError):
    """The Prometheus credentials Secret is missing or lacks its key (the user can fix it;
    the tuning loop looks again now and then)."""


def _decode(data: Mapping[str, str], key: str) -> str:
    return base64.b64decode(data[key]).decode().strip()


def auth_headers(secret: Mapping[str, Any], ref: SecretKeyRef) -> dict[str, str]:
    """The ``Authorization`` header from a Secret (as the API returns it: base64 ``data``).

        >>> import base64
    import ssl
        >>> b64 = lambda s: base64.b64encode(s.encode()).decode()
        >>> auth_headers({"data": {"token": b64("abc")}}, SecretKeyRef(name="p"))
        {'Authorization': 'Bearer abc'}
        >>> auth_headers({"type": "kubernetes.io/basic-auth",
        ...               "data": {"username": b64("u"), "password": b64("p")}},
        ...              SecretKeyRef(name="p"))
        {'Authorization': 'Basic dTpw'}
    """
    data: Mapping[str, str] = secret.get("data") or {}
    if secret.get("type") == BASIC_AUTH:
        missing = [k for k in ("username", "password") if k not in data]
        if missing:
            raise AuthSecretError(
                f"{_FIELD}: Secret {ref.name} of type {BASIC_AUTH} has no "
                f"{' or '.join(missing)}; add the key(s)"
            )
        pair = f"{_decode(data, 'username')}:{base64.b64decode(data['password']).decode()}"
        return {"Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}
    if ref.key not in data:
        # The Secret's other keys are not named: whoever reads the status may not read it.
        raise AuthSecretError(
            f"{_FIELD}.key: Secret {ref.name} has no key {ref.key!r}; set key to the one "
            "holding the bearer token"
        )
    token = _decode(data, ref.key)
    if not token:
        raise AuthSecretError(f"{_FIELD}: key {ref.key!r} of Secret {ref.name} is empty")
    return {"Authorization": f"Bearer {token}"}


def _parts(url: str) -> tuple[str, str, int | None, str]:
    """(scheme, host, port, path without a trailing slash), the default port filled in."""
    u = urlsplit(url.strip())
    scheme = u.scheme.lower()
    try:
        port = u.port
    except ValueError:
        port = -1  # an unreadable port never matches a readable one
    if port is None:
        port = {"http": 80, "https": 443}.get(scheme)
    return scheme, (u.hostname or "").lower(), port, u.path.rstrip("/")


def same_url(a: str, b: str) -> bool:
    """Whether two Prometheus base URLs are the same address (case of scheme and host, a
    default port and a trailing slash aside).

    >>> same_url("http://Prom.monitoring:80/", "http://prom.monitoring")
    True
    >>> same_url("http://prom.monitoring:9090", "http://prom.monitoring:9090.evil.example")
    False
    """
    return _parts(a) == _parts(b)


def url_allowed(url: str, allowlist: Sequence[str]) -> bool:
    """Whether ``url`` is an entry of ``allowlist`` or a path below one (same scheme, host
    and port; the path continues at a ``/``). An empty list allows every URL.

    >>> url_allowed("http://prom:9090/prometheus", ["http://prom:9090"])
    True
    >>> url_allowed("http://prom:9090@evil.example", ["http://prom:9090"])
    False
    """
    if not allowlist:
        return True
    scheme, host, port, path = _parts(url)
    for entry in allowlist:
        e_scheme, e_host, e_port, e_path = _parts(entry)
        if (scheme, host, port) != (e_scheme, e_host, e_port):
            continue
        if path == e_path or path.startswith(e_path + "/"):
            return True
    return False


def check_url_allowed(url: str, allowlist: Sequence[str]) -> None:
    """Raise :class:`SpecError` naming the field and the setting when ``url`` is not allowed."""
    if not url_allowed(url, allowlist):
        raise SpecError(
            f"{_URL_FIELD}: {url} is not among the Prometheus URLs this operator may query "
            f"({_ALLOWLIST}: {', '.join(allowlist)}); use one of them, or ask the operator's "
            "administrator to add it"
        )


def _opted_in(secret: Mapping[str, Any]) -> bool:
    labels = (secret.get("metadata") or {}).get("labels") or {}
    return labels.get(LABEL_CREDENTIALS) == "true"


async def _opted_in_secret(
    api: k8s.ApiClient, namespace: str, name: str, unusable: AuthSecretError
) -> Mapping[str, Any]:
    """The Secret ``name``, read by name, if it carries the opt-in label; else ``unusable``
    (one message for missing and unlabelled, so a SpecTuning cannot probe which exist)."""
    core = k8s.CoreV1Api(api)
    try:
        secret = await asyncio.to_thread(read_json, core.read_namespaced_secret, name, namespace)
    except ApiException as exc:
        if exc.status == 404:
            raise unusable from None
        raise api_error(exc, f"read Secret {namespace}/{name}") from None
    # The label first: nothing of a Secret that did not opt in is used, or said.
    if not isinstance(secret, Mapping) or not _opted_in(secret):
        raise unusable
    return secret


async def prometheus_headers(
    api: k8s.ApiClient, namespace: str, ref: SecretKeyRef | None, url: str
) -> dict[str, str]:
    """The HTTP headers for Prometheus at ``url``: none, or ``Authorization`` from
    ``authSecretRef`` (see the module docstring for the rules a Secret must meet)."""
    if ref is None:
        return {}
    unusable = AuthSecretError(
        f"{_FIELD}: Secret {namespace}/{ref.name} not found, or not labelled "
        f'{LABEL_CREDENTIALS}: "true"; spectune uses only Secrets that opt in. Create it (a '
        f"bearer token under key {ref.key!r}, or a {BASIC_AUTH} Secret) with that label, or "
        "label the existing one if it is meant for Prometheus"
    )
    secret = await _opted_in_secret(api, namespace, ref.name, unusable)
    annotations = (secret.get("metadata") or {}).get("annotations") or {}
    bound = annotations.get(ANNOTATION_PROMETHEUS_URL)
    if bound is not None and not same_url(str(bound), url):
        raise AuthSecretError(
            f"{_FIELD}: Secret {namespace}/{ref.name} is bound by its "
            f"{ANNOTATION_PROMETHEUS_URL} annotation to another Prometheus URL than {url}, "
            f"and is never sent elsewhere; set {_URL_FIELD} to the URL the Secret names"
        )
    return auth_headers(secret, ref)


async def prometheus_tls(
    api: k8s.ApiClient, namespace: str, tls: PrometheusTLS | None
) -> ssl.SSLContext:
    """How Prometheus' certificate is checked: the system's CAs, the CA bundle of
    ``tls.caSecretRef`` (a Secret that opted in, as for credentials: the operator reads no
    other), or not at all (``insecureSkipVerify``)."""
    if tls is None or tls.ca_secret_ref is None:
        return tls_context(None, tls is not None and tls.insecure_skip_verify)
    ref = tls.ca_secret_ref
    unusable = AuthSecretError(
        f"{_CA_FIELD}: Secret {namespace}/{ref.name} not found, or not labelled "
        f'{LABEL_CREDENTIALS}: "true"; spectune uses only Secrets that opt in. Create it (the '
        f"PEM CA bundle under key {ref.key!r}) with that label, or label the existing one"
    )
    secret = await _opted_in_secret(api, namespace, ref.name, unusable)
    data: Mapping[str, str] = secret.get("data") or {}
    if ref.key not in data:
        raise AuthSecretError(
            f"{_CA_FIELD}.key: Secret {ref.name} has no key {ref.key!r}; set key to the one "
            "holding the PEM CA bundle (cert-manager writes ca.crt)"
        )
    try:
        pem = base64.b64decode(data[ref.key]).decode()
        return tls_context(pem)
    except (ValueError, UnicodeDecodeError, InputError):
        raise AuthSecretError(
            f"{_CA_FIELD}: key {ref.key!r} of Secret {ref.name} is not PEM certificates "
            "(-----BEGIN CERTIFICATE-----); give the CA that signed Prometheus' certificate"
        ) from None


def pod_ready(pod: Mapping[str, Any]) -> bool:
    """Whether a pod serves: Running, Ready and not being deleted."""
    status = pod.get("status") or {}
    if pod.get("metadata", {}).get("deletionTimestamp") or status.get("phase") != "Running":
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or []
    )


def pod_urls(pods: Sequence[Mapping[str, Any]], scrape: ScrapeMetrics) -> list[str]:
    """The metrics URL of every Running, Ready pod with an IP.

    >>> pod = {"metadata": {"name": "a"}, "status": {"phase": "Running", "podIP": "10.0.0.7",
    ...        "conditions": [{"type": "Ready", "status": "True"}]}}
    >>> pod_urls([pod], ScrapeMetrics(port=8000))
    ['http://10.0.0.7:8000/metrics']
    """
    urls = []
    for pod in pods:
        ip = (pod.get("status") or {}).get("podIP")
        if not ip or not pod_ready(pod):
            continue
        host = f"[{ip}]" if ":" in ip else ip
        urls.append(f"http://{host}:{scrape.port}{scrape.path}")
    return sorted(urls)


class PodsScrapeSource:
    """A windowed source over the serving pods of one Deployment, scraped directly.

    Parameters
    ----------
    pods
        Lists the Deployment's pods (the target's own, or the canary's).
    scrape
        ``spec.metrics.scrape``: the port and path of the metrics page.
    what
        Which pods these are, for messages ("the target llama").
    sleep
        How to wait out the window (the operator's clock).
    client
        An ``httpx.AsyncClient`` to reuse (tests pass one over a mock transport).
    max_bytes
        The largest metrics page read (``SPECTUNE_SCRAPE_MAX_BYTES``).
    """

    def __init__(
        self,
        pods: Callable[[], Awaitable[list[Obj]]],
        scrape: ScrapeMetrics,
        what: str,
        sleep: Callable[[float], Awaitable[None]],
        client: httpx.AsyncClient | None = None,
        max_bytes: int = MAX_PAGE_BYTES,
    ) -> None:
        self._pods = pods
        self._max = max_bytes
        self._scrape = scrape
        self._what = what
        self._sleep = sleep
        self._client = client

    async def observe(self, window_s: float) -> Observation:
        """Scrape the pods that serve now, wait out the window, scrape them again."""
        urls = pod_urls(await self._pods(), self._scrape)
        if not urls:
            raise NoDataError(f"no Running and Ready pod of {self._what} to scrape")
        source = PodScrapeSource(urls, sleep=self._sleep, client=self._client, max_bytes=self._max)
        return await source.observe(window_s)
