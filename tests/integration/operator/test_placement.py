"""Load-matched trials (issue [H]): the canary takes the place of target replicas.

With N = 3 target replicas and a 1-replica canary, placement ``replace`` (the default where it
can hold) scales the target to 2 once the canary is Ready, so 3 pods serve as before and each
carries the target's own per-pod load, and back to 3 before the canary leaves. What is
asserted is what ``kubectl`` shows: the pods (watched, Ready and not terminating), the
Deployments' replica counts and annotations, the SpecTuning's trials and conditions. Every
way a trial can stop early (a SIGKILLed operator, a deleted SpecTuning, ``suspend: true``,
someone else scaling the target) leaves the target at its own count; where replace cannot
hold (an HPA on the target, one replica) the canary runs beside with the reason said; on one
replica ``strategy: inPlace`` is a switchback on the target itself (A/B/A/B in its spec).

The operator runs with ``SPECTUNE_TIME_SCALE=30`` and kwok pods with a simulator each
(``tests/fixtures/simpods.py``): a 5 m window is 10 s of wall time.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client, watch

from spectune.k8s.projection import decode_memory
from tests.fixtures.cluster import Cluster, wait_for
from tests.fixtures.prometheus import Prometheus
from tests.fixtures.simpods import SimPods
from tests.integration.operator.conftest import OperatorProcess
from tests.integration.operator.helpers import (
    MODEL,
    TARGET,
    Env,
    arm_of,
    deployment,
    diagnostics,
    spectuning,
)

BEFORE = "spectune.io/replicas-before-trial"
DURING = "spectune.io/replicas-during-trial"


class ServingWatch:
    """Watches the target's and the canaries' pods (one label selects both): how many serve,
    i.e. are Ready and not terminating, at every change; the fewest seen once N served."""

    def __init__(self, env: Env, n: int) -> None:
        self.env = env
        self.n = n
        self.fewest: int | None = None
        self.at_fewest: dict[str, bool] = {}
        self._pods: dict[str, bool] = {}
        self._w = watch.Watch()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._stop = threading.Event()

    def __enter__(self) -> ServingWatch:
        wait_for(lambda: self.serving() >= self.n, timeout=60, message="the target serving")
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._w.stop()
        self._thread.join(timeout=10)

    def serving(self) -> int:
        pods = self.env.core.list_namespaced_pod(self.env.ns, label_selector=f"app={TARGET}")
        return sum(_serves(p) for p in pods.items)

    def _loop(self) -> None:
        rv = None
        while not self._stop.is_set():
            try:
                if rv is None:  # the state to follow: a list, then its changes from there
                    listed = self.env.core.list_namespaced_pod(
                        self.env.ns, label_selector=f"app={TARGET}"
                    )
                    self._pods = {p.metadata.name: _serves(p) for p in listed.items}
                    rv = listed.metadata.resource_version
                    self._note()
                for ev in self._w.stream(
                    self.env.core.list_namespaced_pod,
                    self.env.ns,
                    label_selector=f"app={TARGET}",
                    resource_version=rv,
                    timeout_seconds=30,
                ):
                    pod = ev["object"]
                    rv = pod.metadata.resource_version
                    name = pod.metadata.name
                    if ev["type"] == "DELETED":
                        self._pods.pop(name, None)
                    else:
                        self._pods[name] = _serves(pod)
                    self._note()
            except Exception:  # an expired resourceVersion: list afresh
                rv = None

    def _note(self) -> None:
        count = sum(self._pods.values())
        if self.fewest is None or count < self.fewest:
            self.fewest = count
            self.at_fewest = dict(self._pods)


@dataclass(frozen=True)
class Row:
    """One look at the target, its pods and the running trial."""

    trial: tuple[str, str] | None
    windows: int
    replicas: int
    before: str | None
    target: int
    canary: int


class Sampler:
    """Looks every 0.3 s at the target's count and annotations, how many target and canary
    pods serve, and the running trial (in a thread, for the test's length)."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.rows: list[Row] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                t = self.env.running_trial()
                d = self.env.target()
                self.rows.append(
                    Row(
                        (t["arm"], t["startedAt"]) if t else None,
                        int(t.get("windows", 0)) if t else 0,
                        int(d.spec.replicas),
                        (d.metadata.annotations or {}).get(BEFORE),
                        _ready_pods(self.env, canary=False),
                        _ready_pods(self.env, canary=True),
                    )
                )
            except Exception:  # a passing API error: look again
                pass
            self._stop.wait(0.3)

    def judged(self) -> list[Row]:
        """The looks taken during a trial's first window: after the trial was first seen
        held at 2 + 1, while it still ran with no window recorded and held the target at 2."""
        held: set[tuple[str, str]] = set()
        out = []
        for r in self.rows:
            if r.trial is None or r.windows or r.replicas != 2:
                continue
            if r.trial in held:
                out.append(r)
            elif (r.target, r.canary) == (2, 1):
                held.add(r.trial)
        return out


def _serves(pod: Any) -> bool:
    if pod.metadata.deletion_timestamp is not None:
        return False
    return any(c.type == "Ready" and c.status == "True" for c in pod.status.conditions or [])


def _create_target(env: Env, replicas: int) -> None:
    body = deployment(["serve", MODEL])
    body["spec"]["replicas"] = replicas
    env.apps.create_namespaced_deployment(env.ns, body)

    def ready() -> bool:
        d = env.target()
        s = d.status
        return bool(
            s.observed_generation == d.metadata.generation
            and s.available_replicas == replicas
            and (s.replicas or 0) == replicas
        )

    wait_for(ready, timeout=90, message=f"the target rolled out at {replicas} replicas")


def _notes(env: Env) -> dict[str, str]:
    return dict(env.target().metadata.annotations or {})


def _ready_pods(env: Env, canary: bool) -> int:
    pods = env.core.list_namespaced_pod(env.ns, label_selector=f"app={TARGET}").items
    return sum(
        1
        for p in pods
        if _serves(p) and ((p.metadata.labels or {}).get("spectune.io/role") == "canary") == canary
    )


def _held(env: Env, why: Callable[[], str]) -> dict[str, Any]:
    """Wait until a running trial holds the target at N−c = 2 with its canary Ready."""

    def held() -> dict[str, Any] | None:
        t = env.running_trial()
        d = env.target()
        notes = d.metadata.annotations or {}
        if t is None or d.spec.replicas != 2 or notes.get(DURING) != "2":
            return None
        if _ready_pods(env, canary=False) != 2 or _ready_pods(env, canary=True) != 1:
            return None
        return t

    trial: dict[str, Any] = wait_for(
        held, timeout=120, interval=0.3, message=lambda: f"the target held at 2; {why()}"
    )
    return trial


def _judged(env: Env) -> bool:
    """Whether a trial has a window judged (running still or ended since)."""
    return any(t.get("windows", 0) >= 1 for t in env.trials())


def _restored(env: Env) -> bool:
    d = env.target()
    notes = d.metadata.annotations or {}
    return bool(
        d.spec.replicas == 3
        and (d.status.available_replicas or 0) == 3
        and not env.canaries()
        and BEFORE not in notes
        and DURING not in notes
        and _ready_pods(env, canary=False) == 3
    )


def test_replace_serves_the_target_per_pod_load_and_never_dips_below_n(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    sim_pods: Callable[..., SimPods],
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """N = 3, c = 1: during every judged window the target has 2 Ready pods and the canary
    1; after the search 3 and none; at no moment do fewer than 3 Ready pods serve. The trial
    record shows the per-pod load of each group and their ratio."""
    env = Env(cluster, namespace)
    _create_target(env, 3)
    sims = sim_pods(namespace)
    op = start_operator(namespace)
    why = diagnostics(env, op, sims)
    with ServingWatch(env, 3) as serving, Sampler(env) as samples:
        env.create_spt(spectuning(prometheus.url, search={"window": "5m", "maxTrials": 2}))
        _held(env, why)
        cond = wait_for(
            lambda: (c := env.condition("LoadMatched")) and c["status"] == "True" and c,
            timeout=60,
            message=lambda: f"LoadMatched=True; {why()}",
        )
        assert cond["reason"] == "Replace", cond
        wait_for(
            lambda: env.status().get("phase") == "Monitoring",
            timeout=300,
            message=lambda: f"the search finished; {why()}",
        )
        wait_for(lambda: _restored(env), timeout=60, message=lambda: f"N restored; {why()}")
    # While a trial's first window ran (it starts once the canary serves beside 2 target
    # pods and lasts while the trial holds the target at 2): exactly 2 target pods and 1
    # canary pod served, with the record of N on the target.
    judged = samples.judged()
    assert judged, samples.rows[-20:]
    assert all((r.target, r.canary, r.before) == (2, 1, "3") for r in judged), judged
    assert serving.fewest is not None and serving.fewest >= 3, (serving.fewest, serving.at_fewest)
    measured = [t for t in env.trials() if t.get("windows", 0) >= 1]
    assert measured, env.trials()
    for t in measured:
        assert t["canaryLoadPerPod"] > 0 and t["incumbentLoadPerPod"] > 0, t
        assert t["loadRatio"] > 0, t
    wide = cluster.kubectl("get", "spt", "tune", "-n", namespace, "-o", "wide").stdout
    assert "LOADRATIO" in wide.splitlines()[0], wide


def test_a_killed_operator_restores_n_and_removes_the_canary(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    sim_pods: Callable[..., SimPods],
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """SIGKILL while a trial holds the target at 2: the next operator process finds the
    record on the target, restores 3, removes the canary and ends the trial (aborted)."""
    env = Env(cluster, namespace)
    _create_target(env, 3)
    sims = sim_pods(namespace)
    op = start_operator(namespace)
    why = diagnostics(env, op, sims)
    with ServingWatch(env, 3) as serving:
        env.create_spt(spectuning(prometheus.url))
        trial = _held(env, why)
        os.killpg(op.process.pid, signal.SIGKILL)
        op.process.wait(timeout=10)
        assert env.target().spec.replicas == 2  # nobody restored it yet
        op2 = start_operator(namespace)
        why = diagnostics(env, op2, sims)
        wait_for(lambda: _restored(env), timeout=90, message=lambda: f"N restored; {why()}")

        def ended() -> dict[str, Any] | None:
            for t in env.trials():
                if t["arm"] == trial["arm"] and t["startedAt"] == trial["startedAt"]:
                    return t if t["outcome"] == "aborted" else None
            return None

        t = wait_for(ended, timeout=60, message=lambda: f"the trial ended; {why()}")
        assert "restarted" in t["reason"], t
    assert serving.fewest is not None and serving.fewest >= 3, (serving.fewest, serving.at_fewest)


def test_deleting_the_spectuning_mid_trial_restores_n_first(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    sim_pods: Callable[..., SimPods],
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """Delete the SpecTuning while the target is at 2: its finalizer restores 3 and the
    canary goes only after the target's pods are Ready."""
    env = Env(cluster, namespace)
    _create_target(env, 3)
    sims = sim_pods(namespace)
    op = start_operator(namespace)
    why = diagnostics(env, op, sims)
    with ServingWatch(env, 3) as serving:
        env.create_spt(spectuning(prometheus.url))
        _held(env, why)
        env.custom.delete_namespaced_custom_object(
            "spectune.io", "v1alpha1", namespace, "spectunings", "tune"
        )

        def gone() -> bool:
            try:
                env.spt()
            except client.ApiException as exc:
                return exc.status == 404
            return False

        wait_for(gone, timeout=90, message=lambda: f"the SpecTuning deleted; {op.log()[-2000:]}")
        wait_for(lambda: _restored(env), timeout=30, message="N restored, canary gone")
    assert serving.fewest is not None and serving.fewest >= 3, (serving.fewest, serving.at_fewest)


def test_suspend_mid_trial_restores_n_and_removes_the_canary(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    sim_pods: Callable[..., SimPods],
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """``suspend: true`` while the target is at 2: back to 3, the canary gone, Suspended."""
    env = Env(cluster, namespace)
    _create_target(env, 3)
    sims = sim_pods(namespace)
    op = start_operator(namespace)
    why = diagnostics(env, op, sims)
    with ServingWatch(env, 3) as serving:
        env.create_spt(spectuning(prometheus.url))
        _held(env, why)
        env.patch_spec({"suspend": True})
        wait_for(
            lambda: env.status().get("phase") == "Suspended" and _restored(env),
            timeout=90,
            message=lambda: f"suspended at 3; {why()}",
        )
    assert serving.fewest is not None and serving.fewest >= 3, (serving.fewest, serving.at_fewest)


def test_someone_scaling_the_target_mid_trial_ends_it_and_keeps_their_count(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    sim_pods: Callable[..., SimPods],
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """A person scales the target to 4 while a trial holds it at 2: the trial ends, the
    canary goes, 4 stays (the operator never writes 3 back), and an event says so."""
    env = Env(cluster, namespace)
    _create_target(env, 3)
    sims = sim_pods(namespace)
    op = start_operator(namespace)
    why = diagnostics(env, op, sims)
    env.create_spt(spectuning(prometheus.url))
    trial = _held(env, why)
    env.apps.patch_namespaced_deployment_scale(TARGET, namespace, {"spec": {"replicas": 4}})

    def ended() -> dict[str, Any] | None:
        for t in env.trials():
            if t["arm"] == trial["arm"] and t["startedAt"] == trial["startedAt"]:
                return t if t["outcome"] != "running" else None
        return None

    t = wait_for(ended, timeout=60, message=lambda: f"the trial ended; {why()}")
    assert "scaled by someone else" in t["reason"], t
    assert "ScaledExternally" in env.reasons()
    # From here on the count is 4: the operator may hold it at 4 - 1 for a next trial, with 4
    # as the record, and never goes back to 3.
    for _ in range(20):
        d = env.target()
        notes = d.metadata.annotations or {}
        assert d.spec.replicas in (3, 4), d.spec.replicas
        if d.spec.replicas == 3:
            assert notes.get(BEFORE) == "4" and notes.get(DURING) == "3", notes
        else:
            assert notes.get(BEFORE) in (None, "4"), notes
        threading.Event().wait(0.5)


def test_an_hpa_on_the_target_keeps_the_canary_beside_and_is_never_edited(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    sim_pods: Callable[..., SimPods],
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """An autoscaling/v2 HPA whose scaleTargetRef is the target: the canary runs beside
    (LoadMatched=False, reason Autoscaled), the target is never scaled, the HPA's spec and
    generation unchanged."""
    env = Env(cluster, namespace)
    _create_target(env, 3)
    hpa_api = client.AutoscalingV2Api(cluster.api)
    hpa_api.create_namespaced_horizontal_pod_autoscaler(
        namespace,
        {
            "metadata": {"name": "llama"},
            "spec": {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": TARGET},
                "minReplicas": 3,
                "maxReplicas": 3,
                "metrics": [
                    {
                        "type": "Resource",
                        "resource": {
                            "name": "cpu",
                            "target": {"type": "Utilization", "averageUtilization": 80},
                        },
                    }
                ],
            },
        },
    )
    before = hpa_api.read_namespaced_horizontal_pod_autoscaler("llama", namespace)
    sims = sim_pods(namespace)
    op = start_operator(namespace)
    why = diagnostics(env, op, sims)
    env.create_spt(spectuning(prometheus.url))
    cond = wait_for(
        lambda: (c := env.condition("LoadMatched")) and c,
        timeout=90,
        message=lambda: f"the LoadMatched condition; {why()}",
    )
    assert (cond["status"], cond["reason"]) == ("False", "Autoscaled"), cond
    assert "HorizontalPodAutoscaler llama" in cond["message"], cond
    wait_for(
        lambda: _judged(env),
        timeout=120,
        message=lambda: f"a judged window beside; {why()}",
    )
    d = env.target()
    assert d.spec.replicas == 3 and BEFORE not in (d.metadata.annotations or {})
    after = hpa_api.read_namespaced_horizontal_pod_autoscaler("llama", namespace)
    assert after.metadata.generation == before.metadata.generation
    assert after.spec == before.spec


def test_one_replica_runs_the_canary_beside_with_the_reason(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    sim_pods: Callable[..., SimPods],
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """N = 1: matched load would leave no incumbent; the canary runs beside the one pod,
    LoadMatched=False with reason SingleReplica, and the target keeps its replica."""
    env = Env(cluster, namespace)
    _create_target(env, 1)
    sims = sim_pods(namespace)
    op = start_operator(namespace)
    why = diagnostics(env, op, sims)
    env.create_spt(spectuning(prometheus.url))
    wait_for(
        lambda: (
            env.running_trial()
            and _ready_pods(env, canary=False) == 1
            and _ready_pods(env, canary=True) == 1
        ),
        timeout=120,
        interval=0.3,
        message=lambda: f"a canary serving beside the one target pod; {why()}",
    )
    d = env.target()
    assert d.spec.replicas == 1 and BEFORE not in (d.metadata.annotations or {})
    wait_for(
        lambda: _judged(env),
        timeout=120,
        message=lambda: f"a judged window beside; {why()}",
    )
    cond = env.condition("LoadMatched")
    assert cond is not None and (cond["status"], cond["reason"]) == ("False", "SingleReplica")
    assert "1/2 of the target's load" in cond["message"], cond
    d = env.target()
    assert d.spec.replicas == 1 and BEFORE not in (d.metadata.annotations or {})


class ArmWatch:
    """Looks every 0.2 s at the target's spec: the arm its pod template runs after every
    change (what ``kubectl get deploy -o yaml`` shows), when each change was seen, and when
    each rollout was first seen Ready (one pod, updated and available), in a thread."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.changes: list[tuple[float, str]] = []
        self.ready: list[tuple[float, str]] = []
        self.replicas: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> ArmWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def arms(self) -> list[str]:
        return [arm for _, arm in self.changes]

    def _loop(self) -> None:
        ready_gen: int | None = None
        while not self._stop.is_set():
            try:
                d = self.env.target()
                now = time.time()
                arm = arm_of([str(a) for a in d.spec.template.spec.containers[0].args])
                if not self.changes or self.changes[-1][1] != arm:
                    self.changes.append((now, arm))
                s = d.status
                self.replicas.add(int(d.spec.replicas))
                ready = (
                    s.observed_generation == d.metadata.generation
                    and s.updated_replicas == 1
                    and s.available_replicas == 1
                    and (s.replicas or 0) == 1
                )
                if ready and ready_gen != d.metadata.generation:
                    ready_gen = d.metadata.generation
                    self.ready.append((now, arm))
            except Exception:  # a passing API error: look again
                pass
            self._stop.wait(0.2)


def test_in_place_on_one_replica_is_a_switchback_with_a_washout_after_each_restart(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    sim_pods: Callable[..., SimPods],
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """N = 1, ``strategy: inPlace``: the trial runs on the target itself, which alternates
    between the incumbent A and the trial arm B (A/B/A/B/A in the Deployment's spec, two
    restarts per pair), no window is measured within the wash-out after a restart, each
    judged window pairs B with the A stretch after it, and the trial ends with the target
    on an arm at 1 replica and no canary ever created."""
    env = Env(cluster, namespace)
    env.create_target(["serve", MODEL])
    sims = sim_pods(namespace)
    op = start_operator(namespace)
    why = diagnostics(env, op, sims)
    window_s, washout_s = 300 / 30, 180 / 30  # 5m and 3m at SPECTUNE_TIME_SCALE=30
    # One trial, and more drafts than three windows hold: it measures three pairs.
    search = {"window": "5m", "maxTrials": 1, "minDrafts": 10**9, "strategy": "inPlace",
              "switchback": {"washout": "3m"}}  # fmt: skip
    with ArmWatch(env) as watch:
        env.create_spt(spectuning(prometheus.url, search=search))

        def ended() -> dict[str, Any] | None:
            trials = env.trials()
            return trials[0] if trials and trials[0]["outcome"] != "running" else None

        trial = wait_for(ended, timeout=420, interval=1.0, message=lambda: f"the trial; {why()}")
        wait_for(env.target_ready, timeout=60, message=lambda: f"the target ready; {why()}")
        time.sleep(1.0)  # the watch's last look
    b = trial["arm"]
    assert trial["outcome"] == "measured" and trial["windows"] == 3, trial
    assert watch.arms()[:7] == ["off", b, "off", b, "off", b, "off"], watch.changes
    assert trial["switchback"] is True and trial["restarts"] == 6, trial  # 2 per pair
    assert not env.canaries() and watch.replicas == {1}, watch.replicas
    d = env.target()
    notes = d.metadata.annotations or {}
    assert d.spec.replicas == 1 and not {"spectune.io/trial", "spectune.io/switchback"} & set(
        notes
    ), notes
    assert arm_of(env.target_args()) in ("off", b)

    def agreed() -> str | None:
        # The decision after the trial (a promotion of B, or keeping A) patches the target
        # first and the status after it: they agree once that step is written.
        arm = arm_of(env.target_args())
        return arm if arm == (env.status().get("applied") or {}).get("arm") else None

    assert wait_for(agreed, timeout=30, message=lambda: f"applied = target; {why()}") in ("off", b)

    # Wash-out: every measured stretch starts at least washout_s after its rollout was seen
    # Ready (the watch sees it up to a look late; the operator, up to a poll late). The A
    # stretch of each pair is the recorded window; the B stretch ends when the target is
    # switched back to A.
    slack = 1.0
    record = decode_memory(env.status()["history"])["history"]["trials"][0]
    to_a = [at for at, arm in watch.changes[2:] if arm == "off"]
    for j, w in enumerate(record["windows"]):
        start, end = float(w["start_s"]), float(w["end_s"])
        assert abs(end - start - window_s) < 0.01, w
        ready_a = max(at for at, arm in watch.ready if arm == "off" and at <= start)
        assert start >= ready_a + washout_s - slack, (j, start, ready_a, watch.ready)
        b_end = to_a[j]
        ready_b = max(at for at, arm in watch.ready if arm == b and at <= b_end)
        assert b_end - window_s >= ready_b + washout_s - slack, (j, b_end, ready_b)
        assert w["canary"] and w["incumbent"], w  # B paired with its A stretch
    assert "Switchback" in env.reasons()
    assert op.process.poll() is None
