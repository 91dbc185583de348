r"""spectune-v2's performance model: every arm's objective at the target's load, with its posterior.

One model replaces the per-case corrections of ``search/model.py`` (issue [J]). It has
three physical parts and one statistical one, each fitted on every window of every group
(incumbent, canary, incumbent alone) of the epochs whose acceptance still holds:

1. **Acceptance** (:class:`Acceptance`). vLLM's per-position counters give, per drafter,
   how many drafts reached position ``i``. The conditional rate ``P(L ≥ i+1 | L ≥ i)`` of
   each position gets a Beta posterior from those counts, so one trial at a drafter's
   largest ``k`` prices every shorter ``k`` (:math:`E_d(k) = 1 + \sum_{i \le k} P(L \ge i)`)
   and a longer one is extrapolated with the last measured rate. Where an engine exports only
   the mean accepted length (SGLang), a geometric curve with that mean stands in. A drafter
   never measured draws its first-position rate from its method's prior
   (``spectune_policy.METHOD_ACCEPTANCE``).
2. **Step time** (:class:`StepModel`). One engine step verifies ``b·(k+1)`` tokens for a
   batch of ``b`` and runs ``k`` draft steps: :math:`s = \theta_0 + \theta_1 b(k+1) +
   k(\varphi_{0,d} + \varphi_{1,d} b)`. The first term is the weight read (memory-bound),
   the second the verified tokens past it, the third the drafter's own forward passes. The
   measured step is the mean per-token latency times the window's mean accepted length
   (tokens per step). Bayesian weighted least squares, weighted by finished requests and on
   the relative scale (a step's noise is a share of it), with weak priors: a draft step
   costs the SpecTuning's assumed draft cost of a target step until measured. Two draft
   lengths of one drafter, or ``off`` and one length, identify the plain step; this is a
   property of the fit, not a rule.
3. **Batch at a load** (:func:`batch_at_load`). Little's law at ``Λ`` output tokens per
   second per pod: the batch is ``b = Λ·s(b)/E``, linear in ``b``, so
   ``b = Λ·A/(E − Λ·B)`` with ``s = A + B·b``. When ``E ≤ Λ·B`` the arm cannot generate
   tokens as fast as they are asked for at this load: it saturates and queues
   (:data:`SATURATION_PENALTY`).
4. **Objective** (:class:`ObjectiveFit`). The objective of a window is its mean per-token
   latency at its batch times a tail factor: :math:`\log J = \log \hat\tau_a(b) + \nu_d +
   \eta_a + \omega_w + \epsilon`. ``ν_d`` is the drafter's tail (acceptance spread across
   requests widens a p95 relative to the mean), ``η_a`` the arm's residual from the step
   model (a CUDA-graph staircase, an engine effect), ``ω_w`` the window's effect shared by
   both groups (the traffic of that window: this keeps the pairing), ``ε`` the window's
   sampling noise from its quantile interval. Gaussian priors make it one ridge regression.

At the target's load ``Λ*``, :func:`predict` draws the objective of every arm: the
acceptance and step posteriors give ``τ̂_a(Λ*)``; a measured arm is moved from the load it
was measured at by the model (zero for a load-matched trial), an unmeasured one is read off
the model directly; then ``ν + η`` from the regression. The draws of all arms share each
draw of the step model, so differences between arms carry the model's correlations.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from spectune.core import AcceptanceSpread, fit_acceptance_spread, tail_ratio
from spectune.search.arms import OFF, Arm, parse_arm
from spectune.search.history import History, WindowRecord
from spectune.search.objective import Metric, WindowStats

__all__ = [
    "SATURATION_PENALTY",
    "Acceptance",
    "GroupWindow",
    "ObjectiveFit",
    "Prediction",
    "StepModel",
    "batch_at_load",
    "group_windows",
    "predict",
]

#: Log-objective added to a draw in which the arm cannot keep up with the target's load.
#: Its queue then grows for as long as the load lasts, so any finite figure understates it;
#: log 2 (twice as slow) is far beyond every tolerance ε, which is all the decision needs.
SATURATION_PENALTY = math.log(2.0)
#: Prior spread of a drafter's tail factor around the pooled one (log units): the spread of
#: acceptance across requests moves a p95 relative to the mean by about ±10 %.
TAIL_PRIOR = 0.10
#: Prior spread of an arm's residual from the step model (log units): the drafter's tail
#: factor is shared by its draft lengths, so what is left between neighbouring k is an
#: unmodelled step (a CUDA-graph size, an overhead), about 1–2 %.
ARM_PRIOR = 0.015
#: Prior spread of a window's effect shared by its groups (log units): traffic of one window
#: (lengths, prompts) moves both groups' objective by up to about ±10 %.
WINDOW_PRIOR = 0.10
#: Floor of a window's sampling noise (log units): two windows of one arm on the same
#: traffic differ by about this much even when the quantile intervals are tight.
NOISE_FLOOR = 0.02
#: Model-form error of moving an arm's measurement to another load, per e-fold of load
#: (log units): the roofline's split of a step into weight read, verified tokens and draft
#: passes is only identified where loads were seen, so the error of the move grows with its
#: length; 5 % per e-fold leaves a ±15 % load move (a matched trial) inside 1 %.
LOAD_MOVE_ERROR = 0.05
#: An arm counts as measured at the target's load when it was seen in a window whose service
#: load per pod is within this factor of it (the same load up to a window's rate noise), and
#: its own pods carried that service load within the same factor (:func:`_carried`). The
#: model moves it from there, with :data:`LOAD_MOVE_ERROR`.
NEAR_LOAD = 1.25
#: Prior relative noise of a measured step (log units) and its weight in windows.
STEP_NOISE_PRIOR = 0.05
STEP_NOISE_DOF = 3.0
#: Decay of the conditional acceptance rate per position in a never-measured drafter's prior.
PRIOR_DECAY = 0.95


@dataclass(frozen=True)
class GroupWindow:
    """One group's figures in one window, with the arm it ran."""

    arm: Arm
    window: int
    """Index shared by the groups of one window (the pairing)."""
    stats: WindowStats
    service_load: float = math.nan
    """The window's output tokens per second per pod over both groups: the load the service
    was under, whatever share the balancer gave this group."""

    @property
    def load(self) -> float:
        """Output tokens per second per pod."""
        return self.stats.tokens_per_pod

    @property
    def step(self) -> float:
        """Mean time of one engine step: per-token latency times tokens per step."""
        s = self.stats
        tokens = s.mean_accepted_length if self.arm.drafter is not None else 1.0
        return s.tpot_mean * tokens


def _usable(s: WindowStats | None) -> bool:
    return (
        s is not None
        and s.requests > 0
        and s.pods > 0
        and math.isfinite(s.tpot_mean)
        and s.tpot_mean > 0
        and math.isfinite(s.running)
    )


def _arm(name: str) -> Arm | None:
    try:
        arm = parse_arm(name)
    except ValueError:
        return None
    return arm if arm.adaptive is None else None


def group_windows(history: History) -> list[GroupWindow]:
    """Every usable group-window of the epochs whose acceptance still holds, in order."""
    epochs = set(history.acceptance_epochs())
    records: list[tuple[str, str, WindowRecord]] = []
    for t in history.trials:
        if t.epoch in epochs:
            records += [(w.incumbent_arm or t.incumbent, t.arm, w) for w in t.windows]
    for epoch, w in history.baseline:
        if epoch in epochs and w.incumbent_arm:
            records.append((w.incumbent_arm, "", w))
    out: list[GroupWindow] = []
    for i, (inc_name, can_name, w) in enumerate(sorted(records, key=lambda r: r[2].start_s)):
        groups = [g for g in (w.incumbent, w.canary) if g is not None and g.pods]
        pods = sum(g.pods for g in groups)
        tokens = math.fsum(g.tokens_per_s for g in groups if math.isfinite(g.tokens_per_s))
        service = tokens / pods if pods else math.nan
        for name, s in ((inc_name, w.incumbent), (can_name, w.canary)):
            arm = _arm(name) if name else None
            if arm is not None and s is not None and _usable(s):
                out.append(GroupWindow(arm, i, s, service))
    return out


# -- 1. acceptance -------------------------------------------------------------------------


@dataclass(frozen=True)
class Acceptance:
    """Per-position acceptance counts of one drafter, or a method prior when unmeasured."""

    tried: tuple[float, ...]
    """Drafts that reached position ``i`` and drafted position ``i + 1`` (``i = 0..``)."""
    reached: tuple[float, ...]
    """Of those, the drafts whose position ``i + 1`` was accepted."""
    prior: tuple[float, float] = (2.0, 2.0)
    """Beta prior of the first-position rate, for a drafter with no counts."""

    @classmethod
    def of(cls, stats: Iterable[WindowStats], prior: tuple[float, float]) -> Acceptance:
        """Pooled counts of a drafter's windows (geometric from the mean accepted length
        where the engine exports no per-position counters). Each position counts only the
        windows that drafted it, so a short ``k`` does not dilute a long one's tail."""
        tried, reached = np.zeros(0), np.zeros(0)
        for s in stats:
            if not s.drafts > 0:
                continue
            per = np.asarray(s.accepted_per_pos, dtype=float)
            if per.size == 0 and math.isfinite(s.mean_accepted_length):
                per = s.drafts * _geometric_survival(s.mean_accepted_length, max(s.k, 1))
            before = np.concatenate([[s.drafts], per[:-1]])
            if per.size > reached.size:
                reached = np.pad(reached, (0, per.size - reached.size))
                tried = np.pad(tried, (0, per.size - tried.size))
            reached[: per.size] += np.minimum(per, before)
            tried[: per.size] += before
        return cls(tuple(float(x) for x in tried), tuple(float(x) for x in reached), prior)

    def draws(self, ks: Sequence[int], rng: np.random.Generator, n: int) -> dict[int, np.ndarray]:
        """Draws of ``E(k)`` for each ``k`` in ``ks`` (the same ``n`` curves for all)."""
        depth = max(max(ks, default=0), 1)
        rates = np.empty((n, depth))
        m = min(len(self.reached), depth)
        if self.tried and self.tried[0] > 0:
            got, tried = np.array(self.reached[:m]), np.array(self.tried[:m])
            rates[:, :m] = rng.beta(got + 0.5, tried - got + 0.5, size=(n, m))
            for i in range(m, depth):
                rates[:, i] = rates[:, m - 1]
        else:
            first = rng.beta(*self.prior, size=n)
            for i in range(depth):
                rates[:, i] = first * PRIOR_DECAY**i
        survival = np.cumprod(rates, axis=1)
        return {k: 1.0 + survival[:, :k].sum(axis=1) for k in ks}


def _geometric_survival(mean_length: float, k: int) -> np.ndarray:
    """P(L ≥ i), i = 1..k, of a geometric acceptance whose mean accepted length at ``k`` is
    ``mean_length`` (solved by bisection on the first-position rate)."""
    target = min(max(mean_length, 1.0), k + 1.0)
    lo, hi = 0.0, 1.0
    for _ in range(50):
        a = (lo + hi) / 2
        if 1.0 + sum(a**i for i in range(1, k + 1)) < target:
            lo = a
        else:
            hi = a
    a = (lo + hi) / 2
    return np.array([a**i for i in range(1, k + 1)])


# -- 2. step time --------------------------------------------------------------------------


@dataclass(frozen=True)
class StepModel:
    """The posterior of the step-time coefficients (see the module docstring)."""

    drafters: tuple[str, ...]
    mean: np.ndarray
    cov: np.ndarray

    def features(self, arm: Arm, batch: np.ndarray | float) -> np.ndarray:
        """The design row(s) of ``arm`` at ``batch``: ``[1, b(k+1), k·1[d], k·b·1[d] ...]``."""
        b = np.atleast_1d(np.asarray(batch, dtype=float))
        x = np.zeros((b.size, 2 + 2 * len(self.drafters)))
        x[:, 0] = 1.0
        x[:, 1] = b * (arm.k + 1)
        if arm.drafter in self.drafters:
            j = 2 + 2 * self.drafters.index(arm.drafter)
            x[:, j] = arm.k
            x[:, j + 1] = arm.k * b
        return x

    def coefficient_draws(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` draws of the coefficients, each at least zero: every term is a time the
        step spends (weights, verified tokens, draft passes), never a time it saves."""
        draws = rng.multivariate_normal(self.mean, self.cov, size=n, method="cholesky")
        floor = np.zeros_like(self.mean)
        floor[0] = 0.05 * abs(self.mean[0])
        out: np.ndarray = np.maximum(draws, floor)
        return out

    @classmethod
    def fit(
        cls, gws: Sequence[GroupWindow], drafters: Sequence[str], draft_cost: float
    ) -> StepModel:
        """Bayesian weighted least squares on the relative scale (module docstring, 2)."""
        names = tuple(drafters)
        empty = cls(names, np.zeros(0), np.zeros((0, 0)))
        steps = np.array([g.step for g in gws])
        batch = np.array([g.stats.running for g in gws])
        s0 = float(np.median(steps)) if len(gws) else 0.02
        b0 = max(float(np.median(batch)) if len(gws) else 1.0, 1.0)
        n0 = max(
            float(np.median([g.stats.running * (g.arm.k + 1) for g in gws])) if gws else 1.0, 1.0
        )
        prior_mean = np.zeros(2 + 2 * len(names))
        prior_sd = np.zeros_like(prior_mean)
        # Without the hardware, whether a step is bound by reading the weights or by the
        # verified tokens is unknown until two loads or two draft lengths are seen: the prior
        # splits the typical step evenly between them, each part as uncertain as itself.
        prior_mean[0], prior_sd[0] = s0 / 2, s0 / 2
        prior_mean[1], prior_sd[1] = s0 / (2 * n0), s0 / n0
        for j in range(len(names)):
            # A draft pass reads the drafter's weights (φ0) and computes over the batch
            # (φ1·b): at one load the two cannot be told apart, so the prior splits the
            # assumed cost evenly between them at the typical batch.
            prior_mean[2 + 2 * j], prior_sd[2 + 2 * j] = draft_cost * s0 / 2, draft_cost * s0
            prior_mean[3 + 2 * j] = draft_cost * s0 / (2 * b0)
            prior_sd[3 + 2 * j] = draft_cost * s0 / b0
        if not gws:
            return cls(names, prior_mean, np.diag(prior_sd**2))
        x = np.vstack([empty.features(g.arm, g.stats.running) for g in gws])
        weights = np.array([g.stats.requests for g in gws]) / steps**2
        noise = STEP_NOISE_PRIOR
        for _ in range(2):
            mean, cov = _ridge(x, steps, weights / noise**2, prior_mean, prior_sd)
            resid = (steps - x @ mean) / steps
            w_share = weights * steps**2 / np.mean(weights * steps**2)
            ss = STEP_NOISE_DOF * STEP_NOISE_PRIOR**2 + float(np.sum(w_share * resid**2))
            noise = math.sqrt(ss / (STEP_NOISE_DOF + len(gws)))
        return cls(names, mean, cov)


def _ridge(
    x: np.ndarray, y: np.ndarray, w: np.ndarray, prior_mean: np.ndarray, prior_sd: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Posterior mean and covariance of Gaussian linear regression with known weights."""
    precision = x.T @ (w[:, None] * x) + np.diag(1.0 / prior_sd**2)
    cov = np.linalg.inv(precision)
    mean = cov @ (x.T @ (w * y) + prior_mean / prior_sd**2)
    return mean, (cov + cov.T) / 2


# -- 3. batch at a load --------------------------------------------------------------------


def batch_at_load(
    coef: np.ndarray, model: StepModel, arm: Arm, expected: np.ndarray, load: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per draw: the batch ``b`` that serves ``load`` output tokens/s per pod, and whether
    the arm saturates there (module docstring, 3). ``coef`` is ``(n, p)``, ``expected``
    ``(n,)``."""
    a = coef @ model.features(arm, 0.0)[0]
    slope = coef @ (model.features(arm, 1.0)[0] - model.features(arm, 0.0)[0])
    a = np.maximum(a, 1e-6)
    slope = np.maximum(slope, 0.0)
    room = expected - load * slope
    saturated = room <= 0.05 * expected
    batch = np.where(saturated, np.nan, load * a / np.maximum(room, 1e-9))
    return batch, saturated


def _tpot(
    coef: np.ndarray, model: StepModel, arm: Arm, expected: np.ndarray, load: float
) -> tuple[np.ndarray, np.ndarray]:
    """Per draw: log mean per-token latency at ``load``, and saturation."""
    batch, sat = batch_at_load(coef, model, arm, expected, load)
    b = np.nan_to_num(batch, nan=0.0)
    x0 = model.features(arm, 0.0)[0]
    x1 = model.features(arm, 1.0)[0] - x0
    step = np.maximum(coef @ x0 + (coef @ x1) * b, 1e-6)
    return np.log(step / expected), sat


# -- 4. the objective ----------------------------------------------------------------------


def _window_noise(s: WindowStats) -> float:
    """A window's log-objective sampling spread from its 95 % interval, floored."""
    lo, hi = s.objective_low, s.objective_high
    spread = NOISE_FLOOR
    if math.isfinite(lo) and math.isfinite(hi) and lo > 0 and hi > lo:
        spread = max(spread, (math.log(hi) - math.log(lo)) / 3.92)
    return spread


@dataclass(frozen=True)
class ObjectiveFit:
    """The posterior of ``ν_d + η_a`` per arm (module docstring, 4)."""

    arms: tuple[str, ...]
    mean: np.ndarray
    cov: np.ndarray

    @classmethod
    def fit(
        cls, gws: Sequence[GroupWindow], offsets: np.ndarray, arms: Sequence[Arm], metric: Metric
    ) -> ObjectiveFit:
        """One ridge regression of ``log J − log τ̂`` on drafter, arm and window effects."""
        names = tuple(a.name for a in arms)
        drafters = sorted({a.drafter or "" for a in arms})
        windows = sorted({g.window for g in gws})
        ys = np.array([_log_objective(g.stats, metric) for g in gws]) - offsets
        ok = np.isfinite(ys)
        pooled = float(np.mean(ys[ok])) if ok.any() else 0.0
        nd, na, nw = len(drafters), len(names), len(windows)
        p = nd + na + nw
        prior_mean = np.zeros(p)
        prior_mean[:nd] = pooled
        prior_sd = np.concatenate([[TAIL_PRIOR] * nd, [ARM_PRIOR] * na, [WINDOW_PRIOR] * nw])
        rows, y, w = [], [], []
        for g, v, good in zip(gws, ys, ok, strict=True):
            if not good or g.arm.name not in names:
                continue
            r = np.zeros(p)
            r[drafters.index(g.arm.drafter or "")] = 1.0
            r[nd + names.index(g.arm.name)] = 1.0
            r[nd + na + windows.index(g.window)] = 1.0
            rows.append(r)
            y.append(v)
            w.append(1.0 / _window_noise(g.stats) ** 2)
        if rows:
            mean, cov = _ridge(np.array(rows), np.array(y), np.array(w), prior_mean, prior_sd)
        else:
            mean, cov = prior_mean, np.diag(prior_sd**2)
        # Keep ν_d + η_a per arm: a window's effect is not a property of any arm.
        m = np.zeros((na, p))
        for i, a in enumerate(arms):
            m[i, drafters.index(a.drafter or "")] = 1.0
            m[i, nd + i] = 1.0
        return cls(names, m @ mean, m @ cov @ m.T)


def _log_objective(s: WindowStats, metric: Metric) -> float:
    v = s.objective
    return math.log(v) if math.isfinite(v) and v > 0 else math.nan


# -- the prediction ------------------------------------------------------------------------


@dataclass(frozen=True)
class Prediction:
    """Draws of every arm's log objective at the target's load (sign: larger is worse)."""

    arms: tuple[Arm, ...]
    loss: np.ndarray
    """``(draws, arms)``: log objective, negated for a metric to maximise."""
    saturated: np.ndarray
    """``(arms,)``: share of draws in which the arm cannot keep up with the load."""
    measured: frozenset[str]
    """Arms measured at the target's load (:data:`NEAR_LOAD`): the only ones a decision may
    rest on."""
    load: float

    def column(self, arm: Arm) -> np.ndarray:
        """The draws of one arm."""
        return self.loss[:, self.arms.index(arm)]


def _acceptances(
    gws: Sequence[GroupWindow], arms: Sequence[Arm], priors: dict[str, tuple[float, float]]
) -> dict[str, Acceptance]:
    by: dict[str, list[WindowStats]] = {}
    for g in gws:
        if g.arm.drafter is not None:
            by.setdefault(g.arm.drafter, []).append(g.stats)
    names = {a.drafter for a in arms if a.drafter is not None}
    return {d: Acceptance.of(by.get(d, ()), priors.get(d, (2.0, 2.0))) for d in names}


def _tails(gws: Sequence[GroupWindow], metric: Metric) -> dict[str, AcceptanceSpread]:
    """Per drafter, the spread of acceptance across requests fitted to its counters, where
    the objective is a per-request latency quantile that the spread widens."""
    if metric not in (Metric.TPOT_P95, Metric.E2E_P95):
        return {}
    by: dict[str, list[tuple[tuple[float, ...], float]]] = {}
    for g in gws:
        if g.arm.drafter is not None and g.stats.accepted_per_pos and g.stats.drafts > 0:
            by.setdefault(g.arm.drafter, []).append((g.stats.accepted_per_pos, g.stats.drafts))
    out = {}
    for d, windows in by.items():
        spread = fit_acceptance_spread(windows)
        if spread is not None:
            out[d] = spread
    return out


def _tail_offset(tails: dict[str, AcceptanceSpread], arm: Arm) -> float:
    """log(p95 / mean) of per-token latency over requests from the acceptance spread: a
    request that accepts little is slow, and more so the longer its drafts
    (:func:`spectune.core.tail_ratio`); 0 without a fitted spread (the tail factor ν then
    carries it)."""
    spread = tails.get(arm.drafter or "")
    return math.log(tail_ratio(spread, arm.k)) if spread is not None else 0.0


def _carried(g: GroupWindow, latest: float) -> bool:
    """Whether ``g`` measured its arm at the service load ``latest``: the window's service
    load per pod was within :data:`NEAR_LOAD` of it, and so was the load the arm's own pods
    carried.

    A balancer that routes by outstanding requests sends an arm slower per token fewer of
    them (it holds each longer), and a faster one more, so a canary's share of the traffic
    is a property of its arm, not the trial's plan: one at 0.6 of the service's load per pod
    ran a smaller batch than the target will. What it would do at the target's batch is the
    step model's extrapolation, and the model form is least known exactly where loads were
    not seen; a decision must rest on a load the arm carried (the model may still move it
    inside the factor, as it does a matched trial).
    """
    if not (latest > 0 and g.service_load > 0):
        return False
    near = 1 / NEAR_LOAD <= g.service_load / latest <= NEAR_LOAD
    return near and 1 / NEAR_LOAD <= g.load / g.service_load <= NEAR_LOAD


def predict(
    history: History,
    arms: Sequence[Arm],
    metric: Metric,
    load: float,
    priors: dict[str, tuple[float, float]],
    draft_cost: float,
    rng: np.random.Generator,
    n: int = 2000,
) -> Prediction:
    """Draws of every arm's objective at ``load`` tokens/s per pod (module docstring).

    An arm is *measured* (:attr:`Prediction.measured`) when it was seen in a window at the
    service load per pod the latest window ran at (the load trials reach now: the target's
    own where canaries take its pods' place, less where they run beside it); the model then
    moves it to ``load``."""
    arms = list(dict.fromkeys([OFF, *arms]))
    gws = group_windows(history)
    latest = max(gws, key=lambda g: g.window).service_load if gws else math.nan
    drafters = sorted({a.drafter for a in arms if a.drafter is not None})
    model = StepModel.fit(gws, drafters, draft_cost)
    acc = _acceptances(gws, arms, priors)
    coef = model.coefficient_draws(rng, n)
    exp = {
        d: a.draws(sorted({x.k for x in arms if x.drafter == d}), rng, n) for d, a in acc.items()
    }

    def expected(arm: Arm) -> np.ndarray:
        return np.ones(n) if arm.drafter is None else exp[arm.drafter][arm.k]

    # A throughput at a given offered load is that load unless the arm saturates: per-token
    # latency does not enter it, only the saturation does.
    latency = metric.minimise
    tails = _tails(gws, metric)
    offsets = np.zeros(len(gws))
    for i, g in enumerate(gws):
        if latency:
            e = float(np.mean(expected(g.arm))) if g.arm in arms else 1.0
            step = float(model.mean @ model.features(g.arm, g.stats.running)[0])
            offsets[i] = math.log(max(step, 1e-6) / e) + _tail_offset(tails, g.arm)
    fit = ObjectiveFit.fit(gws, offsets, arms, metric)
    tail = rng.multivariate_normal(fit.mean, fit.cov, size=n, method="cholesky")
    loss = np.empty((n, len(arms)))
    sat_share = np.zeros(len(arms))
    measured: set[str] = set()
    for j, arm in enumerate(arms):
        log_tau, sat = _tpot(coef, model, arm, expected(arm), load)
        log_tau = log_tau + _tail_offset(tails, arm) if latency else np.zeros(n)
        own = [i for i, g in enumerate(gws) if g.arm == arm and g.load > 0]
        if own:
            if any(_carried(gws[i], latest) for i in own):
                measured.add(arm.name)
            # Moved by the model from the windows nearest the target's load (no move for a
            # load-matched trial), with the same draws, and an error that grows with the move.
            gap = {i: abs(math.log(gws[i].load / load)) for i in own}
            near = [i for i in own if gap[i] <= min(gap.values()) + math.log(NEAR_LOAD)]
            at = float(np.mean([gws[i].load for i in near]))
            base, _ = _tpot(coef, model, arm, expected(arm), at)
            meas = float(np.mean(offsets[near]))
            shift = np.nan_to_num(log_tau - base, nan=0.0) if latency else 0.0
            form = LOAD_MOVE_ERROR * abs(math.log(load / at)) * rng.standard_normal(n)
            log_tau = np.asarray(meas + shift + (form if latency else 0.0), dtype=float)
            # A draw in which the arm saturates at a load it was seen serving is refuted by
            # that window (whose objective holds whatever queue it had).
            _, sat_seen = _tpot(coef, model, arm, expected(arm), max(gws[i].load for i in own))
            sat = sat & ~sat_seen
        value = log_tau + tail[:, j] + np.where(sat, SATURATION_PENALTY, 0.0)
        loss[:, j] = value if metric.minimise else -value
        sat_share[j] = float(np.mean(sat))
    return Prediction(tuple(arms), loss, sat_share, frozenset(measured), load)
