"""The fault matrix of issue [G] on the operator (issue [E]): what a user sees when things fail.

Each test runs ``spectune run`` as the RBAC manifest's ServiceAccount (or, for the RBAC fault,
a copy of it with one verb removed) against the real API server, the real Prometheus and
simulated vLLM pods (``tests/fixtures/simpods.py``), injects one fault, and asserts only what
``kubectl`` shows: the SpecTuning's phase, conditions, trials and events, and the
Deployments. Windows are 10 s of wall time on a simulator running 30x faster.
"""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import yaml

from spectune.api.names import KIND
from spectune.k8s.projection import decode_memory
from tests.fixtures.cluster import Cluster, wait_for
from tests.fixtures.prometheus import Prometheus
from tests.fixtures.simpods import DEFAULT_SCENARIO, SimPods
from tests.integration.operator.conftest import OperatorProcess
from tests.integration.operator.helpers import (
    MODEL,
    TARGET,
    Env,
    diagnostics,
    kubeconfig_without,
    spectuning,
)

WINDOW_S = 10.0


def _mid_trial(env: Env, why: Callable[[], str], windows: int = 0) -> dict[str, Any]:
    """Wait for a running trial with its canary up (and ``windows`` windows measured)."""

    def running() -> dict[str, Any] | None:
        t = env.running_trial()
        if t is None or t.get("windows", 0) < windows or len(env.canaries()) != 1:
            return None
        return t

    trial: dict[str, Any] = wait_for(
        running, timeout=90, interval=0.5, message=lambda: f"a running trial; {why()}"
    )
    return trial


def _same_trial(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return bool(a["arm"] == b["arm"] and a["startedAt"] == b["startedAt"])


def carried_on(
    env: Env,
    watch: CanaryWatch,
    uid: str,
    before: list[dict[str, Any]],
    trial: dict[str, Any],
) -> None:
    """Assert that the operator which took over after a kill went on from the status: never
    more than one canary, each owned by the SpecTuning; the trials before the kill kept as
    they were (the running one may have ended since), the one running at the kill recorded
    once, and no trial started twice."""
    assert watch.most == 1, f"{watch.most} canaries at once: {watch.names}"
    for name, refs in watch.owners.items():
        assert refs and refs[0].kind == KIND and refs[0].uid == uid, (name, refs)
    trials = env.trials()
    for old, new in zip(before[:-1], trials, strict=False):
        assert _same_trial(old, new) and old["outcome"] == new["outcome"], (before, trials)
    assert sum(1 for t in trials if _same_trial(t, trial)) == 1, trials
    starts = [(t["arm"], t["startedAt"]) for t in trials]
    assert len(starts) == len(set(starts)), trials


class CanaryWatch:
    """Polls the canary Deployments in the background; remembers the most seen at once."""

    def __init__(self, env: Env) -> None:
        self.env = env
        self.most = 0
        self.names: set[str] = set()
        self.owners: dict[str, list[Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> CanaryWatch:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                live = [c for c in self.env.canaries() if c.metadata.deletion_timestamp is None]
            except Exception:  # a transient API error: look again
                live = []
            self.most = max(self.most, len(live))
            for c in live:
                self.names.add(c.metadata.name)
                self.owners[c.metadata.name] = list(c.metadata.owner_references or [])
            self._stop.wait(0.3)


# -- 1. Prometheus stopped mid-trial ------------------------------------------------------------


def test_prometheus_down_mid_trial_holds_the_setting(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    sim_pods: Callable[..., SimPods],
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """Prometheus stopped for two windows mid-trial: the target is held, the trial is not
    judged on the missing windows, ``MetricsAvailable`` goes False and back to True, and the
    trial goes on."""
    env = Env(cluster, namespace)
    env.create_target(["serve", MODEL])
    sims = sim_pods(namespace)
    op = start_operator(namespace)
    env.create_spt(spectuning(prometheus.url))
    why = diagnostics(env, op, sims)
    trial = _mid_trial(env, why)
    args = env.target_args()
    generation = env.target().metadata.generation

    prometheus.stop()
    try:
        down = time.monotonic()
        cond = wait_for(
            lambda: (c := env.condition("MetricsAvailable")) and c["status"] == "False" and c,
            timeout=WINDOW_S * 2 + 10,
            message=lambda: f"MetricsAvailable=False; {why()}",
        )
        assert cond["reason"] == "SourceUnavailable" and "holding" in cond["message"], cond
        # Keep it down for two windows in all.
        time.sleep(max(0.0, 2 * WINDOW_S - (time.monotonic() - down)))
        # Held: the target untouched, the same trial still running, no window recorded.
        assert env.target_args() == args
        assert env.target().metadata.generation == generation
        now = env.trials()
        assert _same_trial(now[-1], trial), (trial, now)
        assert now[-1]["outcome"] == "running", now[-1]
        assert now[-1].get("windows", 0) == trial.get("windows", 0), (trial, now[-1])
        assert len(env.canaries()) == 1
        assert env.condition("MetricsAvailable")["status"] == "False"  # type: ignore[index]
    finally:
        prometheus.start()

    wait_for(
        lambda: (c := env.condition("MetricsAvailable")) and c["status"] == "True",
        timeout=WINDOW_S * 3 + 10,
        message=lambda: f"MetricsAvailable=True again; {why()}",
    )

    # Tuning goes on: the trial gains a window or ends and the search moves on.
    def moved_on() -> bool:
        trials = env.trials()
        same = [t for t in trials if _same_trial(t, trial)]
        assert len(same) == 1, trials  # never repeated
        return same[0].get("windows", 0) > trial.get("windows", 0) or trials[-1] is not same[0]

    wait_for(moved_on, timeout=WINDOW_S * 3 + 10, message=lambda: f"tuning resumed; {why()}")
    assert env.status()["phase"] != "Failed"


# -- 2. The operator SIGKILLed mid-trial -------------------------------------------------------


def test_operator_killed_mid_trial_resumes_from_status(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    sim_pods: Callable[..., SimPods],
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """SIGKILL mid-trial, then a new operator process: it resumes the trial from
    ``status.history``; never more than one canary, always owned by the SpecTuning; no trial
    started twice; no promotion done twice."""
    env = Env(cluster, namespace)
    env.create_target(["serve", MODEL])
    sims = sim_pods(namespace)
    op = start_operator(namespace)
    env.create_spt(spectuning(prometheus.url, search={"window": "5m", "maxTrials": 3}))
    why = diagnostics(env, op, sims)
    uid = env.spt()["metadata"]["uid"]
    with CanaryWatch(env) as watch:
        trial = _mid_trial(env, why)
        before = env.trials()
        os.killpg(op.process.pid, signal.SIGKILL)
        op.process.wait(timeout=10)
        time.sleep(2)
        assert len(env.canaries()) == 1  # the canary outlives the process, as it should
        op2 = start_operator(namespace)
        why = diagnostics(env, op2, sims)
        wait_for(
            lambda: env.status().get("phase") == "Monitoring",
            timeout=180,
            interval=0.5,
            message=lambda: f"Monitoring after the restart; {why()}",
        )
        wait_for(lambda: not env.canaries(), timeout=30, message="canaries removed at the end")
    assert op2.process.poll() is None, "the restarted operator exited"
    carried_on(env, watch, uid, before, trial)
    # A trial started by the second process never re-runs, in the same search (epoch), the
    # arm that was mid-trial at the kill; a search re-opened later may measure it again.
    recorded = decode_memory(env.status()["history"])["history"]["trials"]
    started = datetime.fromisoformat(trial["startedAt"].replace("Z", "+00:00")).timestamp()
    killed = next(
        i
        for i, t in enumerate(recorded)
        if t["arm"] == trial["arm"] and abs(t["started_s"] - started) < 1.0
    )
    later = [t for t in recorded[killed + 1 :] if t["epoch"] == recorded[killed]["epoch"]]
    assert all(t["arm"] != trial["arm"] for t in later), recorded

    promotions = decode_memory(env.status()["history"])["history"]["promotions"]
    promoted = [e for e in env.events() if e.reason == "Promoted"]
    # Within a search (an epoch) an arm is never promoted twice in a row. A later epoch (a
    # re-measure) may confirm the same arm; the controller then patches nothing.
    assert all(a[1] != b[1] for a, b in itertools.pairwise(promotions) if a[0] == b[0]), promotions
    assert sum(e.count or 1 for e in promoted) <= len(promotions), (
        [e.message for e in promoted],
        promotions,
    )


# -- 3. A canary arm that crash-loops ------------------------------------------------------------


def _huge_drafter_scenario(path: Path) -> Path:
    """The chat scenario plus a draft model too large for the GPU: its pods die at start-up."""
    doc = yaml.safe_load(DEFAULT_SCENARIO.read_text())
    doc["drafters"].append(
        {
            "name": "huge",
            "method": "draft_model",
            "model": "meta-llama/Llama-3.1-405B-Instruct",
            "weights_gib": 200,
            "params_b": 405,
            "kv_bytes_per_token": 262144,
            "max_k": 4,
        }
    )
    for route in doc["routes"]:
        route["acceptance"]["huge"] = {"alpha": 0.9, "decay": 0.98, "spread": 10}
    path.write_text(yaml.safe_dump(doc))
    return path


def test_crash_looping_canary_is_rolled_back_and_marked_infeasible(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    sim_pods: Callable[..., SimPods],
    start_operator: Callable[..., OperatorProcess],
    tmp_path: Path,
) -> None:
    """A drafter too large for the KV pool: ``spectune sim serve`` exits 1 at start-up for
    its canary pod, and the sim-pods harness shows that as the kubelet would (kwok runs no
    containers, so the harness writes the pod's container status: ``CrashLoopBackOff`` with
    the last termination ``Error``). The operator rolls the canary back within one window,
    records the trial as infeasible and posts a ``TrialInfeasible`` event."""
    env = Env(cluster, namespace)
    env.create_target(["serve", MODEL])
    sims = sim_pods(namespace, scenario=_huge_drafter_scenario(tmp_path / "huge.yaml"))
    op = start_operator(namespace)
    drafters = [
        {
            "name": "huge",
            "method": "draft_model",
            "model": "meta-llama/Llama-3.1-405B-Instruct",
            "maxK": 2,
        }
    ]
    env.create_spt(spectuning(prometheus.url, drafters=drafters))
    why = diagnostics(env, op, sims)
    args = env.target_args()

    crashed = wait_for(
        lambda: sims.crashed_at and dict(sims.crashed_at),
        timeout=90,
        message=lambda: f"a canary pod crashed; {why()}",
    )
    pod, at = next(iter(crashed.items()))
    assert "ValueError" in sims.exits[pod], sims.exits[pod]

    def infeasible() -> dict[str, Any] | None:
        for t in env.trials():
            if t["outcome"] == "infeasible":
                return t
        return None

    trial = wait_for(infeasible, timeout=WINDOW_S + 5, message=lambda: f"infeasible; {why()}")
    assert trial["arm"].startswith("huge/"), trial
    assert "CrashLoopBackOff" in (trial.get("reason") or ""), trial
    wait_for(lambda: not env.canaries(), timeout=5, message="the canary deleted")
    assert time.monotonic() - at <= WINDOW_S + 5, "rolled back later than one window"
    events = [e for e in env.events() if e.reason == "TrialInfeasible"]
    assert events and events[0].type == "Warning", [(e.reason, e.message) for e in env.events()]
    assert "huge/" in events[0].message
    assert env.target_args() == args
    assert op.process.poll() is None


# -- 4. suspend ----------------------------------------------------------------------------------


def test_suspend_removes_canaries_and_resumes(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    sim_pods: Callable[..., SimPods],
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """``suspend: true`` mid-trial: the canary goes, the target stays as it is, phase
    Suspended; ``suspend: false`` resumes the search."""
    env = Env(cluster, namespace)
    env.create_target(["serve", MODEL])
    sims = sim_pods(namespace)
    op = start_operator(namespace)
    env.create_spt(spectuning(prometheus.url))
    why = diagnostics(env, op, sims)
    trial = _mid_trial(env, why)
    args, generation = env.target_args(), env.target().metadata.generation
    env.patch_spec({"suspend": True})
    wait_for(
        lambda: env.status().get("phase") == "Suspended",
        timeout=WINDOW_S + 10,
        message=lambda: f"Suspended; {why()}",
    )
    wait_for(lambda: not env.canaries(), timeout=10, message="canaries removed")
    ready = env.condition("Ready")
    assert ready is not None and ready["reason"] == "Suspended", ready
    time.sleep(4)
    assert not env.canaries()
    assert env.status()["phase"] == "Suspended"
    assert env.target_args() == args and env.target().metadata.generation == generation
    # The trial under way ended (aborted, or measured when its window had just closed); no
    # trial runs while suspended.
    stopped = [t for t in env.trials() if _same_trial(t, trial)]
    assert stopped and stopped[0]["outcome"] in ("aborted", "measured"), env.trials()
    assert env.running_trial() is None, env.trials()

    env.patch_spec({"suspend": False})

    # Resuming means the search acts again: either it starts a trial (with its canary), or,
    # when the trial ended at suspension already settled the question, it promotes the
    # winner into the target — the step the suspension had held back.
    def resumed() -> str | None:
        if env.status().get("phase") == "Suspended":
            return None
        if env.running_trial() is not None:
            return "trial"
        return "promoted" if env.target_args() != args else None

    how = wait_for(resumed, timeout=WINDOW_S * 3, message=lambda: f"acting after resuming; {why()}")
    if how == "trial":
        wait_for(lambda: len(env.canaries()) == 1, timeout=30, message="a canary again")
    else:
        assert env.target().metadata.generation > generation  # a real rollout, not a no-op
    assert env.condition("Ready")["reason"] == "Tuning"  # type: ignore[index]


# -- 5. two SpecTunings on one Deployment ----------------------------------------------------------


def test_second_spectuning_on_a_deployment_is_refused(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """The second SpecTuning of a Deployment says which one owns it and touches nothing."""
    env = Env(cluster, namespace)
    env.create_target(["serve", MODEL])
    op = start_operator(namespace)
    env.create_spt(spectuning(prometheus.url, name="first"))
    wait_for(lambda: env.status("first").get("phase"), timeout=30, message="first has a phase")
    time.sleep(1.1)  # creationTimestamp has a one-second resolution
    env.create_spt(spectuning(prometheus.url, name="second"))

    def refused() -> dict[str, Any] | None:
        c = env.condition("Ready", "second")
        return c if c is not None and c["reason"] == "TargetConflict" else None

    cond = wait_for(refused, timeout=30, message=lambda: f"TargetConflict; {op.log()[-2000:]}")
    assert cond["status"] == "False"
    assert "first" in cond["message"] and "llama" in cond["message"], cond
    assert env.status("second")["phase"] == "Failed"
    time.sleep(3)
    assert env.status("first")["phase"] != "Failed"
    assert (env.condition("Ready", "first") or {}).get("reason") != "TargetConflict"
    for c in env.canaries():
        assert c.metadata.owner_references[0].name == "first"


# -- 6. RBAC without a verb ------------------------------------------------------------------------


@pytest.fixture
def crippled_kubeconfig(
    cluster: Cluster, operator_kubeconfig: Path, tmp_path: Path
) -> Iterator[tuple[Path, Callable[[], None]]]:
    """The operator's permissions without ``patch`` on Deployments, and a way to give it back."""
    with kubeconfig_without(cluster, operator_kubeconfig, tmp_path, "patch") as made:
        yield made


def test_missing_rbac_verb_is_named_and_the_operator_keeps_running(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    start_operator: Callable[..., OperatorProcess],
    crippled_kubeconfig: tuple[Path, Callable[[], None]],
) -> None:
    """Without ``patch`` on Deployments the SpecTuning says so (verb and resource named, in a
    condition and an event); the operator process stays up; given the verb back, it goes on."""
    kubeconfig, restore = crippled_kubeconfig
    env = Env(cluster, namespace)
    env.create_target(["serve", MODEL])
    op = start_operator(namespace, KUBECONFIG=str(kubeconfig))
    env.create_spt(spectuning(prometheus.url))

    def forbidden() -> dict[str, Any] | None:
        c = env.condition("Ready")
        return c if c is not None and c["reason"] == "Forbidden" else None

    cond = wait_for(forbidden, timeout=30, message=lambda: f"Forbidden; {op.log()[-3000:]}")
    assert cond["status"] == "False"
    assert "patch" in cond["message"] and "deployments" in cond["message"], cond
    wait_for(lambda: "Forbidden" in env.reasons(), timeout=15, message="a Forbidden event")
    event = next(e for e in env.events() if e.reason == "Forbidden")
    assert event.type == "Warning" and "patch" in event.message, event.message
    time.sleep(5)
    assert op.process.poll() is None, f"the operator exited:\n{op.log()}"
    assert env.condition("Ready")["reason"] == "Forbidden"  # type: ignore[index]
    assert "spectune.io/fingerprint" not in (env.target().metadata.annotations or {})

    restore()
    wait_for(
        lambda: "spectune.io/fingerprint" in (env.target().metadata.annotations or {}),
        timeout=30,
        message=lambda: f"the operator adopted the target once allowed; {op.log()[-3000:]}",
    )
    wait_for(
        lambda: (env.condition("Ready") or {}).get("reason") != "Forbidden",
        timeout=30,
        message="the Forbidden condition cleared",
    )
    assert op.process.poll() is None


# -- 7. the target Deployment deleted while tuning ----------------------------------------------


def test_target_deleted_while_tuning_removes_canaries_and_resumes_when_it_returns(
    cluster: Cluster,
    namespace: str,
    prometheus: Prometheus,
    sim_pods: Callable[..., SimPods],
    start_operator: Callable[..., OperatorProcess],
) -> None:
    """The target is deleted mid-trial: its canary goes (it would otherwise keep serving the
    Service's traffic alone), the SpecTuning says the target is missing (phase Degraded,
    ``Ready=False, reason=TargetMissing`` naming it, a Warning event) and the operator keeps
    running; recreated, the target is tuned again."""
    env = Env(cluster, namespace)
    env.create_target(["serve", MODEL])
    sims = sim_pods(namespace)
    op = start_operator(namespace)
    env.create_spt(spectuning(prometheus.url))
    why = diagnostics(env, op, sims)
    trial = _mid_trial(env, why)

    env.apps.delete_namespaced_deployment(TARGET, namespace, propagation_policy="Background")
    wait_for(
        lambda: not env.canaries(),
        timeout=WINDOW_S * 2 + 10,
        message=lambda: f"the canary removed with its target gone; {why()}",
    )

    def missing() -> dict[str, Any] | None:
        c = env.condition("Ready")
        return c if c is not None and c["reason"] == "TargetMissing" else None

    cond = wait_for(missing, timeout=WINDOW_S * 2 + 10, message=lambda: f"TargetMissing; {why()}")
    assert cond["status"] == "False" and TARGET in cond["message"], cond
    assert "not found" in cond["message"], cond
    assert env.status()["phase"] == "Degraded"
    ended = [t for t in env.trials() if _same_trial(t, trial)]
    assert ended and ended[0]["outcome"] in ("aborted", "measured", "infeasible"), env.trials()
    event = next(e for e in env.events() if e.reason == "TargetMissing")
    assert event.type == "Warning" and TARGET in event.message
    time.sleep(3)
    assert not env.canaries(), "a canary came back while the target is missing"
    assert op.process.poll() is None, "the operator exited"

    env.create_target(["serve", MODEL])
    wait_for(
        lambda: (env.condition("Ready") or {}).get("reason") == "Tuning",
        timeout=WINDOW_S * 2 + 10,
        message=lambda: f"tuning again; {why()}",
    )
    assert env.status()["phase"] != "Degraded"
    assert "TargetFound" in env.reasons()

    def acting() -> bool:
        return env.running_trial() is not None or env.status().get("phase") == "Monitoring"

    wait_for(acting, timeout=WINDOW_S * 4 + 20, message=lambda: f"tuning resumed; {why()}")
    assert op.process.poll() is None


# -- 8. API server conflicts (409) ----------------------------------------------------------------


def _operator_api(kubeconfig: Path) -> Any:
    from kubernetes import config

    return config.new_client_from_config(str(kubeconfig))


def test_deployment_patch_conflict_is_retried_with_fresh_state(
    cluster: Cluster, namespace: str, operator_kubeconfig: Path
) -> None:
    """A real 409 from the real API server: another writer changes the target between the
    operator's read and its patch (the test forces that interleaving by writing right after
    the operator's first read). The promotion is computed again from the fresh object: the
    target runs the promoted arm AND keeps the other writer's flag — nothing lost."""
    import asyncio

    from spectune.k8s.actuator import CONFLICT_BACKOFF_S, KubeActuator
    from spectune.k8s.deployments import DrafterArgs
    from spectune.search.arms import Arm
    from tests.integration.operator.helpers import EAGLE, arm_of

    env = Env(cluster, namespace)
    env.create_target(["serve", MODEL])
    api = _operator_api(operator_kubeconfig)
    spt = {"metadata": {"name": "tune", "namespace": namespace, "uid": "0"}}
    drafters = {"eagle3": DrafterArgs("eagle3", "eagle3", EAGLE)}
    kube = KubeActuator(api, spt, TARGET, "vllm", "vllm", drafters)
    # Adopted first, as the tuning loop does: a promotion writes only over a setting whose
    # fingerprint the operator recorded (the other writer's flag is no speculative edit).
    asyncio.run(kube.adopt(asyncio.run(kube.read_target())))
    reads: list[str] = []
    read = kube.read_target

    async def read_then_someone_writes() -> dict[str, Any]:
        target = await read()
        reads.append(target["metadata"]["resourceVersion"])
        if len(reads) == 1:  # the concurrent writer: a human adds a flag
            env.apps.patch_namespaced_deployment(
                TARGET,
                namespace,
                {"spec": {"template": {"spec": {"containers": [
                    {"name": "vllm", "args": ["serve", MODEL, "--max-num-seqs", "64"]}]}}}},
            )  # fmt: skip
        return target

    kube.read_target = read_then_someone_writes  # type: ignore[method-assign]
    try:
        asyncio.run(kube.promote(Arm("eagle3", 3)))
    finally:
        api.close()
    # The first patch was refused (409) and retried on a fresh read; the Deployment
    # controller's status writes for the other writer's rollout may refuse a few more.
    assert 2 <= len(reads) <= len(CONFLICT_BACKOFF_S) and reads[0] != reads[1], reads
    args = env.target_args()
    assert arm_of(args) == "eagle3/3", args
    assert args[args.index("--max-num-seqs") + 1] == "64", args
