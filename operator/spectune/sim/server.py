"""Server mode: one simulated replica in (scaled) real time, serving ``/metrics`` like a pod.

``spectune sim serve`` runs this in place of a vLLM container: it takes the same
command-line arguments a vLLM container gets, so when the operator patches a Deployment's
``--speculative-config`` the restarted "pod" behaves differently. The end-to-end harness
launches one process per pod and scrapes it like a real engine.

It listens on loopback only: it is a stand-in for a pod, never a network service.

With a :class:`~spectune.sim.service.Service` (``sim serve --service DIR``) the replica is
one pod of a service: it draws the service's whole arrival stream on the shared clock and
serves only its balancer share, re-reading the service's members before each advance, so
adding a pod splits the load instead of adding to it. :meth:`SimServer.stop` with a time
lets such a pod serve its share until its announced leave.

Endpoints: ``GET /metrics`` (the engine's exposition page), ``GET /health``,
``GET /sim/state`` (arm, phase, model version, simulated seconds, KV blocks, applied events,
the service's live members with ``--service``) and ``POST /sim/events``, which applies one
scenario event to the running replica now — a JSON object in the scenario format's
``events`` terms without ``at_s``, e.g.
``{"kind": "model_version", "version": "v1", "acceptance_scale": {"eagle3": 0.5}}`` (an
acceptance drop; the scale is relative to the file's alphas and replaces an earlier one)
or ``{"kind": "route_mix", "shares": {"chat": 0.3}}``, or ``{"kind": "drafter_broken",
"drafter": "eagle3"}`` (the drafter accepts nothing on this pod until a ``model_version``;
each pod is its own process, so a fleet-wide breakage is posted to every pod). A bad event
is answered 400 with the field named; nothing changes.
"""

from __future__ import annotations

import ipaddress
import json
import threading
import time
from collections.abc import Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from spectune.errors import SpecError
from spectune.search.arms import Arm
from spectune.search.spellings import arm_of_config
from spectune.sim.fleet import Fleet
from spectune.sim.scenario import Scenario, injectable_event
from spectune.sim.service import Service

__all__ = ["SimServer", "arm_from_vllm_args", "model_name_from_vllm_args"]

_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def arm_from_vllm_args(scenario: Scenario, argv: Sequence[str]) -> Arm:
    """The arm an engine command line asks for, mapped onto the scenario's drafters.

    The arguments are read as the scenario's engine reads them: vLLM's
    ``--speculative-config`` (and legacy flags), or SGLang's ``--speculative-*`` flags for
    ``engine: sglang``. A drafter matches by its ``model`` (what goes into the config), or,
    for model-less methods such as ``ngram``, by method. Raises :class:`SpecError` when the
    arguments are malformed or name a drafter the scenario does not have.
    """
    from spectune.engines.args import parse_sglang_args, parse_vllm_args

    parse = parse_sglang_args if scenario.engine == "sglang" else parse_vllm_args
    spec = parse(list(argv)).spec
    if spec is None:
        return Arm(None)
    if spec.model is not None:
        matches = [d for d in scenario.drafters if d.model == spec.model]
        what = f"model {spec.model!r}"
    else:
        matches = [d for d in scenario.drafters if d.model is None and d.method == spec.method]
        what = f"method {spec.method!r} without a model"
    if not matches:
        known = ", ".join(
            f"{d.name} ({d.method}{', ' + d.model if d.model else ''})" for d in scenario.drafters
        )
        raise SpecError(
            f"--speculative-config: {what} matches no drafter of scenario "
            f"{scenario.name!r}; drafters are: {known or '(none)'}"
        )
    if len(matches) > 1:
        raise SpecError(
            f"--speculative-config: {what} matches several drafters "
            f"({', '.join(d.name for d in matches)}); give each a distinct model"
        )
    drafter = matches[0]
    arm = arm_of_config(drafter.name, spec)
    scenario.check_arm(arm)
    return arm


def model_name_from_vllm_args(argv: Sequence[str]) -> str | None:
    """``--served-model-name``, else ``--model`` (``--model-path``), else the positional."""
    args = list(argv)
    found: dict[str, str] = {}
    for i, token in enumerate(args):
        for flag in ("--served-model-name", "--model", "--model-path"):
            if token == flag and i + 1 < len(args):
                found.setdefault(flag, args[i + 1])
            elif token.startswith(flag + "="):
                found.setdefault(flag, token.split("=", 1)[1])
    if "--served-model-name" in found:
        return found["--served-model-name"]
    for flag in ("--model", "--model-path"):
        if flag in found:
            return found[flag]
    if len(args) >= 2 and args[0] == "serve" and not args[1].startswith("-"):
        return args[1]
    return None


def check_loopback(host: str) -> None:
    """Refuse anything but a loopback address: the simulator never serves a network."""
    if host == "localhost":
        return
    try:
        if ipaddress.ip_address(host).is_loopback:
            return
    except ValueError:
        pass
    raise SpecError(f"--host {host}: sim serve listens on loopback only (127.0.0.1 or ::1)")


class SimServer:
    """A one-replica fleet advanced with the wall clock and served over HTTP."""

    def __init__(
        self,
        fleet: Fleet,
        *,
        time_scale: float,
        host: str,
        port: int,
        service: Service | None = None,
    ) -> None:
        if time_scale <= 0:
            raise SpecError(f"--time-scale must be above 0, got {time_scale}")
        check_loopback(host)
        self.fleet = fleet
        self.time_scale = time_scale
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._stop_at: float | None = None
        self.service = service
        """The service this replica is one pod of (its fleet keeps only its share)."""
        self._t0 = time.monotonic()
        self._start_s = fleet.now  # a fleet started on a shared clock is already past 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server._handle(self)

            def do_POST(self) -> None:
                server._handle_post(self)

            def log_message(self, format: str, *args: object) -> None:
                return

        try:
            self._http = ThreadingHTTPServer((host, port), Handler)
        except OSError as exc:
            raise SpecError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        self._http.daemon_threads = True

    @property
    def port(self) -> int:
        """The port actually bound (useful with port 0)."""
        return int(self._http.server_address[1])

    def sim_now(self) -> float:
        """Simulated seconds: the fleet's start plus the scaled wall time since."""
        return self._start_s + (time.monotonic() - self._t0) * self.time_scale

    def serve_forever(self, tick_s: float = 0.05) -> None:
        """Serve until :meth:`stop`, advancing the simulation every ``tick_s`` wall seconds."""
        thread = threading.Thread(target=self._http.serve_forever, daemon=True)
        thread.start()
        try:
            while not self._stop.wait(tick_s):
                self._catch_up()
                if self._stop_at is not None and self.fleet.now >= self._stop_at:
                    break
        finally:
            self._http.shutdown()
            self._http.server_close()

    def stop(self, at_s: float | None = None) -> None:
        """Ask :meth:`serve_forever` to return: now, or once simulated time reaches ``at_s``
        (a pod of a service serves its share until the leave it announced)."""
        if at_s is None:
            self._stop.set()
        else:
            self._stop_at = at_s

    @property
    def stopping(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._stop.is_set() or self._stop_at is not None

    def _catch_up(self) -> None:
        with self._lock:
            target = self.sim_now()
            if self.service is not None:
                # Read after fixing the target: a member announced before this moment is in
                # the directory, and its join lies ahead of the target (service.LEAD_WALL_S).
                self.service.refresh()
            if target > self.fleet.now:
                self.fleet.advance(target)

    def _handle(self, req: BaseHTTPRequestHandler) -> None:
        path = req.path.split("?", 1)[0]
        if path == "/metrics":
            self._catch_up()
            with self._lock:
                body = self.fleet.metrics_text(0).encode("utf-8")
            self._reply(req, 200, body, _CONTENT_TYPE)
        elif path == "/health":
            self._reply(req, 200, b"", "text/plain")
        elif path == "/sim/state":
            with self._lock:
                state = self.fleet.state(0)
                body = json.dumps(
                    {
                        "arm": state.arm.name,
                        "phase": state.phase.value,
                        "model_version": self.fleet.model_version,
                        "sim_seconds": self.fleet.now,
                        "num_gpu_blocks": state.num_gpu_blocks,
                        "service_members": None
                        if self.service is None
                        else [m.name for m in self.service.members if m.live_at(self.fleet.now)],
                        "events": [
                            {"at_s": e.at_s, "kind": e.kind, "detail": e.detail}
                            for e in self.fleet.applied_events
                        ],
                    }
                ).encode("utf-8")
            self._reply(req, 200, body, "application/json")
        else:
            self._reply(req, 404, b"not found\n", "text/plain")

    def _handle_post(self, req: BaseHTTPRequestHandler) -> None:
        if req.path.split("?", 1)[0] != "/sim/events":
            self._reply(req, 404, b"not found\n", "text/plain")
            return
        try:
            length = int(req.headers.get("Content-Length") or 0)
            raw = req.rfile.read(min(length, 65536)) if length > 0 else b""
            try:
                data = json.loads(raw.decode("utf-8") or "null")
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise SpecError(f"event: the body is not JSON ({exc})") from None
            event = injectable_event(self.fleet.scenario, data)
            self._catch_up()
            with self._lock:
                applied = self.fleet.inject(event)
        except SpecError as exc:
            body = json.dumps({"error": str(exc)}).encode("utf-8")
            self._reply(req, 400, body, "application/json")
            return
        answer = {"at_s": applied.at_s, "kind": applied.kind, "detail": applied.detail}
        self._reply(req, 200, json.dumps(answer).encode("utf-8"), "application/json")

    @staticmethod
    def _reply(req: BaseHTTPRequestHandler, code: int, body: bytes, ctype: str) -> None:
        req.send_response(code)
        req.send_header("Content-Type", ctype)
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)
