"""One simulated vLLM engine: scheduler, KV pool, speculative steps — in virtual time.

The fleet owns one :class:`Engine` per running replica (a restart builds a fresh one, so
counters reset as a real pod's do) and drives it with :meth:`Engine.advance`. The physics
is DESIGN.md §4: each step runs ``k`` draft forwards and one verification forward over
``b·(k+1)`` decode tokens plus any prefill chunk, under the ``max_num_batched_tokens``
budget; each decode request accepts a prefix of its drafts with per-request Beta
acceptance and positional decay, and emits the accepted tokens plus one bonus token.

KV blocks: a decoding sequence of ``ctx`` tokens holds ``⌈(ctx + K + 1) / block_size⌉``
blocks (its tokens plus the ``K + 1`` slots a step may write, as vLLM reserves lookahead
slots for ``num_speculative_tokens``), so its holding is a function of ``ctx`` and is
computed, not tracked; prefilling sequences hold the blocks of the chunks computed so far.
Before each step the pool must cover every sequence; if it does not, the most recently
admitted sequence is preempted (recompute) until it does.

Speed comes from skipping ahead. While the batch does not change (no prefill in flight,
nobody admissible in the queue, no arrival due), the next many steps differ only in how
many tokens each request accepts, so they are drawn and accounted for in one vectorised
block; the block ends after the first step in which a request finishes, before the first
step the KV pool cannot hold, or before the caller's horizon. Steps that change the batch
(admission, chunked prefill, preemption) run one at a time with the same formulas.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray
from scipy.special import betaincinv

from spectune.core import flat_rate_for_length
from spectune.search.arms import Arm
from spectune.sim.physics import ArmPhysics
from spectune.sim.scenario import Scenario, SecondPopulation, dist_upper
from spectune.sim.stats import EngineStats
from spectune.sim.traffic import Request

__all__ = ["Engine"]

_I64 = np.int64
_MAX_DRAWS = 65536  # most draws in one skip-ahead block (steps × requests × positions)
_COUNTS = np.arange(1, 4097, dtype=_I64)  # 1, 2, 3, ...: the bonus tokens of successive steps

# SGLang --speculative-adaptive defaults (reference/engines.md §2.4).
_SG_EMA_ALPHA = 0.2
_SG_UPDATE_INTERVAL = 5
_SG_WARMUP_BATCHES = 10
_SG_DOWN_HYSTERESIS = -0.25
_SG_UP_HYSTERESIS = 0.0


class Engine:
    """One replica's engine, running one arm, from ``start_s`` on."""

    def __init__(
        self,
        scenario: Scenario,
        arm: Arm,
        physics: ArmPhysics,
        rng: np.random.Generator,
        start_s: float,
    ) -> None:
        if physics.failure is not None:
            raise ValueError(physics.failure)
        self.arm = arm
        self.physics = physics
        self.rng = rng
        self.start_s = start_s
        self.now = start_s
        self.last_finish = start_s
        tg = scenario.target
        self.block_size = tg.block_size
        self.gpu_memory_utilization = scenario.hardware.gpu_memory_utilization
        self.pool = physics.num_gpu_blocks
        self.max_seqs = tg.max_num_seqs
        self.max_batched = tg.max_num_batched_tokens
        self.k_max = arm.k
        self.stats = EngineStats(physics.max_model_len, arm.k, scenario.engine == "sglang")
        self._max_tokens = [dist_upper(r.output_tokens) for r in scenario.routes]
        # acceptance per route for this arm's drafter: (alpha, decay^(i(i-1)/2), spread)
        self._accept: list[tuple[float, NDArray[np.float64], float] | None] = []
        self._second: list[SecondPopulation | None] = []
        positions = np.arange(1, max(arm.k, 1) + 1, dtype=float)
        for route in scenario.routes:
            acc = route.acceptance.get(arm.drafter) if arm.drafter is not None else None
            if acc is None:
                self._accept.append(None)
                self._second.append(None)
            else:
                decay = acc.decay ** (positions * (positions - 1) / 2.0)
                self._accept.append((acc.alpha, decay, acc.spread))
                self._second.append(acc.second)
        self._graph_max = scenario.hardware.cuda_graph_max_batch
        self._positions = positions
        # per route: decay^(i(i-1)/2), or zeros where the drafter never accepts
        self._decay_rows = [
            spec[1] if spec is not None else np.zeros(len(positions)) for spec in self._accept
        ]
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []
        self.pf_used = 0  # KV blocks held by prefilling requests
        # the decode set, as parallel arrays in admission order (the last is preempted first)
        self.reqs: list[Request] = []
        k_cols = max(arm.k, 1)
        self.ctx: NDArray[np.int64] = np.zeros(0, dtype=_I64)
        self.end: NDArray[np.int64] = np.zeros(0, dtype=_I64)  # ctx at which each finishes
        self.surv: NDArray[np.float64] = np.zeros((0, k_cols), dtype=float)
        self.etok: NDArray[np.float64] = np.zeros(0, dtype=float)  # E[tokens per pass] at K
        self.ctx_sum = 0  # Σ ctx of the decode set, as a Python int
        self.pass_clock = 0  # verification passes with drafts so far (per decode sequence)
        self._affine: dict[tuple[int, int, bool, int], tuple[float, float]] = {}
        self.finished: list[Request] = []
        # In-engine adaptive modes (docs/arms.md "How the twin models them"):
        # adaptive verification: which drafted positions each running request verifies
        # this step (None: every request verifies all k), and the verified drafts Σk_i;
        self._mask: NDArray[np.float64] | None = None
        self._verified = 0
        # SGLang tiers: the running tier, the EMA of the accept length, steps seen.
        self._tier = len(arm.tiers) - 1 if arm.tiers else 0
        self._ema = float("nan")
        self._tier_steps = 0
        self._since_update = 0
        #: verification steps run at each draft length (tiers and verify arms), for tests.
        self.steps_at_k: dict[int, int] = {}

    # --- the outside: queue, state ----------------------------------------------------

    def enqueue(self, req: Request, scale: Mapping[str, float]) -> None:
        """Accept ``req`` (arrived now) into the waiting queue, drawing its acceptance rate.

        ``scale`` is the current model version's acceptance scale per drafter.
        """
        spec = self._accept[req.route]
        if spec is None or self.arm.drafter is None:
            req.alpha = 0.0
        else:
            alpha, _, spread = spec
            u = req.u_alpha
            second = self._second[req.route]
            if second is not None:
                # one uniform picks the population and the quantile within it, so every arm
                # still sees the same requests accept alike (common random numbers)
                if u < second.share:
                    alpha, spread, u = second.alpha, second.spread, u / second.share
                else:
                    u = (u - second.share) / (1.0 - second.share)
            mean = min(alpha * scale.get(self.arm.drafter, 1.0), 1.0)
            if mean <= 0.0:
                req.alpha = 0.0
            elif mean >= 1.0:
                req.alpha = 1.0
            else:
                req.alpha = float(betaincinv(mean * spread, (1.0 - mean) * spread, u))
        if self.now < req.arrival and self.idle:
            self.now = req.arrival
        self.waiting.append(req)

    @property
    def idle(self) -> bool:
        """Whether the engine holds no request at all."""
        return not self.reqs and not self.prefilling and not self.waiting

    @property
    def running(self) -> int:
        """Requests in the batch (decoding or prefilling)."""
        return len(self.reqs) + len(self.prefilling)

    @property
    def outstanding(self) -> int:
        """Requests the engine holds: running plus waiting."""
        return len(self.reqs) + len(self.prefilling) + len(self.waiting)

    @property
    def used(self) -> int:
        """KV blocks held now (decoding plus prefilling sequences)."""
        bs = self.block_size
        return int(((self.ctx + (self.k_max + bs)) // bs).sum()) + self.pf_used

    def _used_bound(self, extra_tokens_each: int = 0) -> int:
        """An upper bound of :attr:`used` after each sequence grows by ``extra_tokens_each``."""
        b = len(self.reqs)
        grown = self.ctx_sum + b * (self.k_max + 1 + extra_tokens_each)
        return grown // self.block_size + b + self.pf_used

    def kv_usage(self) -> float:
        """Fraction of KV blocks in use."""
        return self.used / self.pool if self.pool else 0.0

    def k_now(self) -> int:
        """Draft length the engine would use for its current batch."""
        if self.arm.drafter is None:
            return 0
        if self.arm.tiers is not None:
            return self.arm.tiers[self._tier]
        if self.arm.verify:
            return self.arm.k
        return self.arm.k_at(self.running)

    def _plan_verification(self, k: int) -> None:
        """Adaptive verification, modelled as vLLM documents it: a budget of
        ``N × optimal_K`` verified drafts (``optimal_K`` from the table at batch ``N``),
        each request drafting at most ``k``, handed out by predicted acceptance. The
        predictor is modelled as exact (each request's own ``P(L ≥ i)``), so the budget goes
        greedily to the positions most likely to land: an upper bound on the online
        estimator of vLLM PR #52228. The drafter runs as deep as the deepest request."""
        b = len(self.reqs)
        self._mask = None
        if not self.arm.verify or k == 0 or b == 0:
            return
        budget = min(b * self.arm.k_at(b), b * k)
        surv = self.surv[:, :k]
        # rank (request, position) by P(L ≥ i), ties to the earlier position, so each
        # request's verified positions are a prefix
        order = np.lexsort((np.tile(np.arange(k), b), -surv.ravel()))
        mask = np.zeros(b * k)
        mask[order[:budget]] = 1.0
        self._mask = mask.reshape(b, k)
        self._verified = budget

    def _surv(self, k: int) -> NDArray[np.float64]:
        """``P(L ≥ i)`` of the positions verified this step (0 where a request stops)."""
        if self._mask is None:
            return self.surv[:, :k]
        out: NDArray[np.float64] = self.surv[:, :k] * self._mask[:, :k]
        return out

    def _verify_tokens(self, b: int, k: int) -> int:
        """Tokens the verification forward runs over for ``b`` decoding requests."""
        return b + self._verified if self._mask is not None else b * (k + 1)

    def _retier(self, accepted: NDArray[np.int64]) -> None:
        """SGLang's adaptive tiers, modelled at the level its docs describe: an EMA
        (α 0.2) of the accept length (accepted drafts + the bonus) over decode steps; after
        10 warm-up steps and every 5 steps, the target ``round(ema) + 1`` (``ema + 0.25``
        for a move down: the down hysteresis) picks the largest tier at or below it. The
        ``throughput_aware`` strategy (sglang#28045) instead picks the tier with the most
        expected tokens per second at this batch, from a flat acceptance fitted to the EMA
        and the engine's own step times (the startup profile, modelled as exact). The
        batch-size-aware rule of sglang#24055 is not modelled: no formula is documented."""
        tiers = self.arm.tiers
        if tiers is None or accepted.size == 0:
            return
        rows = accepted.reshape(-1, accepted.shape[-1]) if accepted.ndim > 1 else accepted[None]
        for mean in (rows.mean(axis=1) + 1.0).tolist():
            self._ema = (
                mean
                if self._ema != self._ema
                else ((1 - _SG_EMA_ALPHA) * self._ema + _SG_EMA_ALPHA * mean)
            )
        self._tier_steps += len(rows)
        self._since_update += len(rows)
        if self._tier_steps < _SG_WARMUP_BATCHES or self._since_update < _SG_UPDATE_INTERVAL:
            return
        self._since_update = 0
        current = tiers[self._tier]
        if self.arm.strategy == "throughput_aware":
            rate = flat_rate_for_length(min(self._ema, current + 1.0), current)
            b = len(self.reqs)

            def speed(s: int) -> float:
                a, c = self._coefficients(b, s)
                return sum(rate**i for i in range(s + 1)) / (a + c * self.ctx_sum)

            self._tier = max(range(len(tiers)), key=lambda i: speed(tiers[i]))
            return
        up = round(self._ema + _SG_UP_HYSTERESIS) + 1
        down = round(self._ema - _SG_DOWN_HYSTERESIS) + 1
        if up > current:
            target = up
        elif down < current:
            target = down
        else:
            return
        fits = [i for i, t in enumerate(tiers) if t <= target]
        self._tier = fits[-1] if fits else 0

    def _until_retier(self) -> int:
        """Steps before SGLang's next tier update (no limit for other arms)."""
        if self.arm.tiers is None:
            return 1 << 30
        left = _SG_UPDATE_INTERVAL - self._since_update
        return max(1, left, _SG_WARMUP_BATCHES - self._tier_steps)

    # --- time -----------------------------------------------------------------------

    def advance(self, until: float) -> None:
        """Run every step that starts before ``until`` (the last may end after it)."""
        while self.now < until:
            if not self.reqs and not self.prefilling and not self.waiting:
                self.now = until
                return
            k = min(self.k_now(), self.k_max)
            self._make_room()
            self._plan_verification(k)
            if self.prefilling or self._can_admit(k):
                self._mixed_step(k)
            elif self.reqs:
                self._run(k, until)
            else:  # pragma: no cover - start-up check guarantees one sequence fits
                self.now = until
                return

    # --- scheduling -----------------------------------------------------------------

    def _make_room(self) -> None:
        """Preempt from the back until the pool holds every sequence's next step."""
        while self.reqs and self._used_bound() > self.pool and self.used > self.pool:
            self._preempt_last()

    def _free(self, blocks: int) -> bool:
        """Whether ``blocks`` more blocks fit in the pool now."""
        if self._used_bound() + blocks <= self.pool:
            return True
        return self.used + blocks <= self.pool

    def _can_admit(self, k: int) -> bool:
        if not self.waiting or self.running >= self.max_seqs:
            return False
        budget = self.max_batched - len(self.reqs) * (k + 1)
        if budget <= 0:
            return False
        chunk = min(self.waiting[0].to_compute, budget)
        return self._free(-(-chunk // self.block_size))

    def _preempt_last(self) -> None:
        """Recompute preemption of the most recently admitted request (vLLM V1)."""
        if self.prefilling:
            req = self.prefilling.pop()
            self.pf_used -= req.held
        else:
            i = len(self.reqs) - 1
            req = self._write_back(i)
            keep = np.ones(len(self.reqs), dtype=bool)
            keep[i] = False
            self._drop(keep)
        req.held = 0
        req.computed = 0
        req.to_compute = req.prompt + req.generated
        req.preemptions += 1
        self.stats.preemptions += 1
        self.waiting.appendleft(req)

    def _mixed_step(self, k: int) -> None:
        """One step that carries prefill chunks (continuing or newly admitted requests)."""
        bs = self.block_size
        budget = self.max_batched - len(self.reqs) * (k + 1)
        pf_tokens = 0
        pf_ctx = 0
        completing: list[Request] = []
        for req in self.prefilling:
            if budget <= 0:
                break
            chunk = min(req.to_compute - req.computed, budget)
            need = -(-(req.computed + chunk) // bs) - req.held
            if not self._free(need):
                break
            req.held += need
            self.pf_used += need
            req.computed += chunk
            budget -= chunk
            pf_tokens += chunk
            pf_ctx += req.computed
            if req.computed >= req.to_compute:
                completing.append(req)
        while self.waiting and budget > 0 and self.running < self.max_seqs:
            req = self.waiting[0]
            chunk = min(req.to_compute, budget)
            need = -(-chunk // bs)
            if not self._free(need):
                break
            self.waiting.popleft()
            if req.scheduled < 0:
                req.scheduled = self.now
            req.held = need
            self.pf_used += need
            req.computed = chunk
            budget -= chunk
            pf_tokens += chunk
            pf_ctx += chunk
            self.prefilling.append(req)
            if req.computed >= req.to_compute:
                completing.append(req)
        if pf_tokens == 0 and not self.reqs:
            # Prefills block one another on blocks: make room as vLLM does, from the back.
            self._preempt_last()
            return
        self._step(k, pf_tokens, pf_ctx, len(completing))
        if completing:
            self._complete_prefills(completing)

    def _complete_prefills(self, done: list[Request]) -> None:
        """Prefill finished: sample the first (or next, after recompute) token."""
        now = self.now
        stats = self.stats
        joining: list[Request] = []
        for req in done:
            self.prefilling.remove(req)
            self.pf_used -= req.held
            req.held = 0
            req.generated += 1
            if req.first_token < 0:
                req.first_token = now
                ttft = now - req.arrival
                stats.ttft.observe(ttft)
                if stats.sglang:
                    stats.sg_ttft.observe(ttft)
                stats.prompt_tokens += req.prompt
                stats.prefix_queries += req.prompt
            if req.generated >= req.output:
                self._finish(req)
            else:
                req.joined_clock = self.pass_clock
                joining.append(req)
        if not joining:
            return
        ctx = [r.prompt + r.generated for r in joining]
        surv = self._survival(joining)
        self.reqs.extend(joining)
        self.ctx = np.concatenate((self.ctx, np.array(ctx, dtype=_I64)))
        self.end = np.concatenate(
            (self.end, np.array([r.prompt + r.output for r in joining], dtype=_I64))
        )
        self.surv = np.concatenate((self.surv, surv))
        self.etok = np.concatenate((self.etok, surv.sum(axis=1) + 1.0))
        self.ctx_sum += sum(ctx)

    def _survival(self, reqs: list[Request]) -> NDArray[np.float64]:
        """``P(L ≥ i)`` for i = 1..K, one row per request.

        ``Π_{j≤i} α·decay^(j−1) = α^i · decay^(i(i−1)/2)``.
        """
        alphas = np.array([r.alpha for r in reqs])
        decay = np.array([self._decay_rows[r.route] for r in reqs])
        surv: NDArray[np.float64] = np.power(alphas[:, None], self._positions) * decay
        return surv

    # --- stepping ---------------------------------------------------------------------

    def _padded(self, n: int, graphs: bool) -> int:
        """Tokens a forward over ``n`` costs: its CUDA graph's captured size, when one runs."""
        if not graphs or not 0 < n <= self._graph_max:
            return n
        if n <= 4:
            return 1 << (n - 1).bit_length()
        return -(-n // 8) * 8

    def _coefficients(self, b: int, k: int, graphs: bool = True) -> tuple[float, float]:
        """Step time of a decode step as ``a + c·C`` (C: total context of the batch);
        ``graphs``: a pure decode step, which a captured CUDA graph runs when one is set."""
        n_v = self._verify_tokens(b, k)
        key = (b, k, graphs, n_v)
        hit = self._affine.get(key)
        if hit is not None:
            return hit
        phys = self.physics
        tgt, draft = phys.target, phys.draft
        n_t, n_d = self._padded(n_v, graphs), self._padded(b, graphs)
        a = tgt.overhead_s + max(tgt.weights_s, tgt.per_token_s * n_t)
        c = tgt.per_context_s
        if k > 0:
            if draft is not None:
                a += k * (draft.overhead_s + max(draft.weights_s, draft.per_token_s * n_d))
                c += k * draft.per_context_s
            a += phys.draft_cpu_s
        self._affine[key] = (a, c)
        return a, c

    def _step(self, k: int, pf_tokens: int, pf_ctx: int, pf_done: int) -> None:
        """One step carrying ``pf_tokens`` of prefill (``pf_done`` prefills complete in it)."""
        phys = self.physics
        tgt, draft = phys.target, phys.draft
        stats = self.stats
        b = len(self.reqs)
        if b == 0:
            dt = tgt.time(pf_tokens, pf_ctx)
            if k > 0 and draft is not None:
                dt += draft.time(pf_tokens, pf_ctx)  # the drafter also reads the prompt
            self.now += dt
            stats.iteration_tokens.observe(float(pf_tokens + pf_done))
            stats.generation_tokens += pf_done
            return
        a, c = self._coefficients(b, k, graphs=pf_tokens == 0)
        n_v = self._verify_tokens(b, k)
        a += max(tgt.weights_s, tgt.per_token_s * (n_v + pf_tokens)) - max(
            tgt.weights_s, tgt.per_token_s * n_v
        )
        a += tgt.per_context_s * pf_ctx
        if k > 0 and draft is not None:
            # the first draft forward also runs over the prefill chunk
            a += max(draft.weights_s, draft.per_token_s * (b + pf_tokens)) - max(
                draft.weights_s, draft.per_token_s * b
            )
            a += draft.per_context_s * pf_ctx
        dt = a + c * self.ctx_sum
        rem = self.end - self.ctx
        if k > 0:
            accepted = (self.rng.random(b)[:, None] < self._surv(k)).sum(axis=1)
            gen = np.minimum(accepted + 1, rem)
            self._account_spec(k, accepted, 1)
            self._retier(accepted)
        else:
            gen = np.ones(b, dtype=_I64)
        total = int(np.add.reduce(gen))
        self.now += dt
        stats.generation_tokens += total + pf_done
        stats.iteration_tokens.observe(float(total + pf_tokens + pf_done))
        stats.itl.observe(dt, float(b))
        if stats.sglang:
            self._sglang_interval(np.array([dt]), gen[None, :], k, total)
        self._advance_sequences(gen, total)

    def _run(self, k: int, until: float) -> None:
        """Run the unchanged decode batch for as many steps as nothing else happens.

        Steps are drawn in one block: the block ends after the first step in which a
        request finishes, before the first step that starts at or after ``until``, and
        before the first step whose KV growth the pool cannot hold.
        """
        # ufuncs are called directly (np.add.reduce, not .sum()): on arrays this small
        # numpy's Python-level wrappers would cost more than the arithmetic.
        add, minimum = np.add, np.minimum
        stats = self.stats
        b = len(self.reqs)
        a, c = self._coefficients(b, k)
        rem = self.end - self.ctx
        dt0 = a + c * self.ctx_sum
        steps = (until - self.now) / dt0 + 1.0
        cap = _MAX_DRAWS // (b * max(k, 1))
        if steps > 8.0:
            to_finish = (
                float(minimum.reduce(rem / self.etok)) * 1.25 + 2.0
                if k > 0
                else float(minimum.reduce(rem))
            )
            steps = min(steps, to_finish)
        n_steps = max(1, int(min(steps, cap, self._until_retier())))
        counts = _COUNTS[:n_steps] if n_steps <= len(_COUNTS) else np.arange(1, n_steps + 1)
        if k > 0:
            draws = self.rng.random((n_steps, b))
            accepted = add.reduce(draws[:, :, None] < self._surv(k)[None, :, :], axis=2)
            cum = add.accumulate(accepted, axis=0)
            cum += counts[:, None]
            per_step = add.reduce(accepted, axis=1)
            per_step += b
            # a request finishes in the step after the last one in which cum < rem
            finishing = int(minimum.reduce(add.reduce(cum < rem, axis=0))) + 1
        else:
            accepted = None
            cum = counts[:, None]
            per_step = np.full(n_steps, b, dtype=_I64)
            finishing = int(minimum.reduce(rem))
        n_run = min(finishing, n_steps)
        if n_steps > 1:
            dts = (add.accumulate(per_step) - per_step) * c
            dts += dt0
            ends = add.accumulate(dts)
            ends += self.now
            # step s starts at ends[s-1]; keep the steps that start before `until`
            n_run = min(n_run, 1 + int(np.searchsorted(ends[:-1], until, side="left")))
            if n_run > 1 and self._used_bound((n_run - 1) * (k + 1)) > self.pool:
                n_run = self._blocks_allow(cum, n_run)
            dts = dts[:n_run]
            self.now = float(ends[n_run - 1])
        else:
            dts = np.array([dt0])
            self.now += dt0
        last = n_run - 1
        gen = minimum(cum[last], rem)
        total = int(add.reduce(gen))
        stats.generation_tokens += total
        step_tokens = per_step[:n_run].astype(float)
        # nobody finished before the last step, so only the last step's tokens are capped
        step_tokens[last] = float(total - (int(add.reduce(cum[last - 1])) if last > 0 else 0))
        stats.iteration_tokens.observe_many(step_tokens)
        stats.itl.observe_many(dts, float(b))
        if accepted is not None:
            self._account_spec(k, accepted[:n_run], n_run)
            self._retier(accepted[:n_run])
        if stats.sglang:
            emitted = (
                accepted[:n_run] + 1 if accepted is not None else np.ones((n_run, b), dtype=_I64)
            )
            emitted[last] = gen - (cum[last - 1] if last > 0 else 0)
            self._sglang_interval(dts, emitted, k, total)
        self._advance_sequences(gen, total, n_run == finishing)

    def _blocks_allow(self, cum: NDArray[np.int64], n_run: int) -> int:
        """How many of ``n_run`` steps fit the pool (step s needs the growth before it)."""
        bs = self.block_size
        need = ((self.ctx + cum[: n_run - 1] + (self.k_max + bs)) // bs).sum(axis=1)
        over = need + self.pf_used > self.pool
        return int(over.argmax()) + 1 if over.any() else n_run

    def _account_spec(self, k: int, accepted: NDArray[np.int64], n_steps: int) -> None:
        stats = self.stats
        self.pass_clock += n_steps
        if self.arm.adaptive is not None:
            self.steps_at_k[k] = self.steps_at_k.get(k, 0) + n_steps
        if self._mask is not None:
            # adaptive verification: a request given no position drafts nothing this step
            depth = self._mask.sum(axis=1)
            drafted = depth > 0
            stats.drafts += n_steps * int(drafted.sum())
            stats.draft_tokens += n_steps * int(depth.sum())
            kept = accepted[..., drafted]
            stats.accepted_hist[: k + 1] += np.bincount(kept.ravel(), minlength=k + 1)
            return
        drafts = accepted.size
        stats.drafts += drafts
        stats.draft_tokens += drafts * k
        stats.accepted_hist[: k + 1] += np.bincount(accepted.ravel(), minlength=k + 1)

    def _advance_sequences(
        self, gen: NDArray[np.int64], total: int, finished: bool | None = None
    ) -> None:
        """Apply the tokens each sequence emitted, and finish those that are done.

        ``finished`` says whether some sequence is done, when the caller knows.
        """
        self.ctx += gen
        self.ctx_sum += total
        if finished is False:
            return
        done = self.ctx >= self.end
        if finished or np.logical_or.reduce(done):
            for i in np.flatnonzero(done).tolist():
                self._finish(self._write_back(i))
            self._drop(~done)

    def _sglang_interval(
        self, dts: NDArray[np.float64], emitted: NDArray[np.int64], k: int, total: int
    ) -> None:
        """SGLang's token-weighted ITL and its per-interval spec/throughput gauges."""
        stats = self.stats
        # each (step, request) observes interval/tokens, counted once per token it emitted
        tokens_each = np.maximum(emitted, 1).astype(float)
        stats.sg_itl.observe_many((dts[:, None] / tokens_each).ravel(), tokens_each.ravel())
        stats.sg_interval_batches += len(dts)
        stats.sg_interval_tokens += total
        if k > 0:
            stats.sg_interval_forwards += emitted.size
            stats.sg_interval_emitted += int(emitted.sum())
        if stats.sg_interval_batches >= 40:
            elapsed = self.now - stats.sg_interval_start
            stats.sg_gen_throughput = stats.sg_interval_tokens / elapsed if elapsed > 0 else 0.0
            if stats.sg_interval_forwards:
                length = stats.sg_interval_emitted / stats.sg_interval_forwards
                stats.sg_accept_length = length
                stats.sg_accept_rate = (length - 1.0) / k if k > 0 else 0.0
            stats.sg_interval_batches = 0
            stats.sg_interval_forwards = 0
            stats.sg_interval_emitted = 0
            stats.sg_interval_tokens = 0
            stats.sg_interval_start = self.now

    # --- bookkeeping ------------------------------------------------------------------

    def _write_back(self, i: int) -> Request:
        """Copy sequence ``i``'s progress from the arrays back onto its request."""
        req = self.reqs[i]
        ctx = int(self.ctx[i])
        req.generated = ctx - req.prompt
        req.passes += self.pass_clock - req.joined_clock
        self.ctx_sum -= ctx
        return req

    def _drop(self, keep: NDArray[np.bool_]) -> None:
        self.reqs = [r for r, kept in zip(self.reqs, keep.tolist(), strict=True) if kept]
        self.ctx = self.ctx[keep]
        self.end = self.end[keep]
        self.surv = self.surv[keep]
        self.etok = self.etok[keep]

    def _finish(self, req: Request) -> None:
        now = self.now
        stats = self.stats
        req.finish = now
        self.last_finish = now
        stats.request_finished(
            now - req.arrival,
            req.scheduled - req.arrival,
            now - req.scheduled,
            req.first_token - req.scheduled,
            now - req.first_token,
            req.prompt,
            req.generated,
            self._max_tokens[req.route],
        )
        stats.success["length" if req.length_capped else "stop"] += 1
        stats.num_requests += 1
        self.finished.append(req)
