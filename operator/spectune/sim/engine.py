"""One simulated vLLM engine: scheduler, KV pool, speculative steps — in virtual time.

The fleet owns one :class:`Engine` per running replica (a restart builds a fresh one, so
counters reset as a real pod's do) and drives it with :meth:`Engine.advance`. The physics
is DESIGN.md §4: each step runs ``k`` draft forwards and one verification forward over
``b·(k+1)`` decode tokens plus any prefill chunk, under the ``max_num_batched_tokens``
budget; each decode request accepts a prefix of its drafts with per-request Beta
acceptance and positional decay, and emits the accepted tokens plus one bonus token.

Speed comes from skipping ahead. While the batch does not change (no prefill in flight,
nobody admissible in the queue, no arrival due), the next many steps differ only in how
many tokens each request accepts, so they are drawn and accounted for in one vectorised
block; the block ends at the first step where a request finishes, the KV pool would run
out, or the caller's horizon is reached. Steps that change the batch (admission, chunked
prefill, preemption) run one at a time. Both paths share the same formulas, so the result
is exactly that of a step-by-step loop with the same draws.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping

import numpy as np
from numpy.typing import NDArray
from scipy.special import betaincinv

from spectune.search.arms import Arm
from spectune.sim.physics import ArmPhysics
from spectune.sim.scenario import Scenario, dist_upper
from spectune.sim.stats import EngineStats
from spectune.sim.traffic import Request

__all__ = ["Engine"]

_I64 = np.int64
_MAX_DRAWS = 65536  # draws per skip-ahead block (steps × requests × draft positions)


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
        positions = np.arange(1, max(arm.k, 1) + 1, dtype=float)
        for route in scenario.routes:
            acc = route.acceptance.get(arm.drafter) if arm.drafter is not None else None
            if acc is None:
                self._accept.append(None)
            else:
                decay = acc.decay ** (positions * (positions - 1) / 2.0)
                self._accept.append((acc.alpha, decay, acc.spread))
        self._positions = positions
        self.waiting: deque[Request] = deque()
        self.prefilling: list[Request] = []
        self.used = 0  # KV blocks held by every admitted request
        # the decode set, as parallel arrays in admission order (the last is preempted first)
        self.reqs: list[Request] = []
        k_cols = max(arm.k, 1)
        self.ctx: NDArray[np.int64] = np.zeros(0, dtype=_I64)
        self.rem: NDArray[np.int64] = np.zeros(0, dtype=_I64)
        self.held: NDArray[np.int64] = np.zeros(0, dtype=_I64)
        self.passes: NDArray[np.int64] = np.zeros(0, dtype=_I64)
        self.acc: NDArray[np.int64] = np.zeros(0, dtype=_I64)
        self.surv: NDArray[np.float64] = np.zeros((0, k_cols), dtype=float)
        self.finished: list[Request] = []

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
            mean = min(alpha * scale.get(self.arm.drafter, 1.0), 1.0)
            if mean <= 0.0:
                req.alpha = 0.0
            elif mean >= 1.0:
                req.alpha = 1.0
            else:
                req.alpha = float(betaincinv(mean * spread, (1.0 - mean) * spread, req.u_alpha))
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

    def kv_usage(self) -> float:
        """Fraction of KV blocks in use."""
        return self.used / self.pool if self.pool else 0.0

    def k_now(self) -> int:
        """Draft length the engine would use for its current batch."""
        return self.arm.k_at(self.running) if self.arm.drafter is not None else 0

    # --- time -----------------------------------------------------------------------

    def advance(self, until: float) -> None:
        """Run every step that starts before ``until`` (the last may end after it)."""
        while self.now < until:
            if not self.reqs and not self.prefilling and not self.waiting:
                self.now = until
                return
            k = min(self.k_now(), self.k_max)
            self._reserve(k)
            if self.prefilling or self._can_admit(k):
                self._mixed_step(k)
            elif self.reqs:
                self._run(k, _MAX_DRAWS, until)
            else:  # pragma: no cover - start-up check guarantees one sequence fits
                self.now = until
                return

    # --- scheduling -----------------------------------------------------------------

    def _reserve(self, k: int) -> None:
        """Give every decoding sequence the blocks this step writes; preempt if short."""
        if not self.reqs:
            return
        bs = self.block_size
        while self.reqs:
            need = (self.ctx + (k + bs)) // bs
            extra = int(np.maximum(need - self.held, 0).sum())
            if extra <= self.pool - self.used:
                self.held = np.maximum(self.held, need)
                self.used += extra
                return
            self._preempt_last()

    def _can_admit(self, k: int) -> bool:
        if not self.waiting or self.running >= self.max_seqs:
            return False
        budget = self.max_batched - len(self.reqs) * (k + 1)
        if budget <= 0:
            return False
        head = self.waiting[0]
        chunk = min(head.to_compute, budget)
        return -(-chunk // self.block_size) <= self.pool - self.used

    def _preempt_last(self) -> None:
        """Recompute preemption of the most recently admitted request (vLLM V1)."""
        if self.prefilling:
            req = self.prefilling.pop()
        else:
            i = len(self.reqs) - 1
            req = self._write_back(i)
            self._drop(np.arange(len(self.reqs)) != i)
        self.used -= req.held
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
            if need > self.pool - self.used:
                break
            req.held += need
            self.used += need
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
            if need > self.pool - self.used:
                break
            self.waiting.popleft()
            if req.scheduled < 0:
                req.scheduled = self.now
            req.held = need
            self.used += need
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
        self._run(k, 1, math.inf, pf_tokens, pf_ctx, len(completing))
        if completing:
            self._complete_prefills(completing)

    def _complete_prefills(self, done: list[Request]) -> None:
        """Prefill finished: sample the first (or next, after recompute) token."""
        now = self.now
        stats = self.stats
        joining: list[Request] = []
        for req in done:
            self.prefilling.remove(req)
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
                self.used -= req.held
                self._finish(req)
            else:
                joining.append(req)
        if not joining:
            return
        ctx = np.array([r.prompt + r.generated for r in joining], dtype=_I64)
        rem = np.array([r.output - r.generated for r in joining], dtype=_I64)
        held = np.array([r.held for r in joining], dtype=_I64)
        surv = np.stack([self._survival(r) for r in joining])
        zeros = np.zeros(len(joining), dtype=_I64)
        self.reqs.extend(joining)
        self.ctx = np.concatenate((self.ctx, ctx))
        self.rem = np.concatenate((self.rem, rem))
        self.held = np.concatenate((self.held, held))
        self.passes = np.concatenate((self.passes, zeros))
        self.acc = np.concatenate((self.acc, zeros))
        self.surv = np.concatenate((self.surv, surv))

    def _survival(self, req: Request) -> NDArray[np.float64]:
        """``P(L ≥ i)`` for i = 1..K: ``Π_{j≤i} α·decay^(j−1) = α^i · decay^(i(i−1)/2)``."""
        spec = self._accept[req.route]
        if spec is None or req.alpha <= 0.0:
            return np.zeros(len(self._positions))
        surv: NDArray[np.float64] = np.power(req.alpha, self._positions) * spec[1]
        return surv

    # --- stepping ---------------------------------------------------------------------

    def _run(
        self,
        k: int,
        max_steps: int,
        until: float,
        pf_tokens: int = 0,
        pf_ctx: int = 0,
        extra_gen: int = 0,
    ) -> None:
        """Run up to ``max_steps`` steps of the current batch (one step when prefilling)."""
        phys = self.physics
        tgt = phys.target
        draft = phys.draft
        stats = self.stats
        b = len(self.reqs)
        if b == 0:
            dt = tgt.time(pf_tokens, pf_ctx)
            if k > 0 and draft is not None:
                dt += draft.time(pf_tokens, pf_ctx)  # the drafter also reads the prompt
            self.now += dt
            stats.iteration_tokens.observe(float(pf_tokens + extra_gen))
            stats.generation_tokens += extra_gen
            return
        # Step time is affine in the batch's context: dt_s = a + c·C_s.
        a = tgt.overhead_s + max(tgt.weights_s, tgt.per_token_s * (b * (k + 1) + pf_tokens))
        c = tgt.per_context_s
        a += tgt.per_context_s * pf_ctx
        if k > 0:
            if draft is not None:
                a += k * (draft.overhead_s + max(draft.weights_s, draft.per_token_s * b))
                if pf_tokens:
                    a += max(draft.weights_s, draft.per_token_s * (b + pf_tokens)) - max(
                        draft.weights_s, draft.per_token_s * b
                    )
                    a += draft.per_context_s * pf_ctx
                c += k * draft.per_context_s
            a += phys.draft_cpu_s
        ctx, rem = self.ctx, self.rem
        c0 = float(ctx.sum())
        surv = self.surv[:, :k] if k > 0 else self.surv[:, :0]
        if max_steps > 1:
            dt0 = a + c * c0
            horizon = (until - self.now) / dt0 + 1.0
            etok = 1.0 + surv.sum(axis=1)
            to_finish = float((rem / etok).min()) * 1.25 + 2.0
            cap = max(1, max_steps // (b * max(k, 1)))
            steps = int(max(1.0, min(horizon, to_finish, float(cap))))
        else:
            steps = 1
        if k > 0:
            u = self.rng.random((steps, b))
            accepted = (u[:, :, None] < surv[None, :, :]).sum(axis=2)
            emitted = accepted + 1
        else:
            accepted = None
            emitted = np.ones((steps, b), dtype=_I64)
        cum = emitted.cumsum(axis=0)
        step_done = (cum >= rem).any(axis=1)
        n_run = int(step_done.argmax()) + 1 if step_done.any() else steps
        per_step = emitted.sum(axis=1)
        if steps > 1:
            before = np.empty(steps, dtype=float)
            before[0] = 0.0
            np.cumsum(per_step[:-1], out=before[1:])
            dts = a + c * (c0 + before)
            starts = np.empty(steps, dtype=float)
            starts[0] = self.now
            np.cumsum(dts[:-1], out=starts[1:])
            starts[1:] += self.now
            n_run = min(n_run, int(np.searchsorted(starts, until, side="left")))
            need_last = None
            if n_run > 1:
                bs = self.block_size
                need = (ctx + cum[: n_run - 1] + (k + bs)) // bs
                total = np.maximum(need, self.held).sum(axis=1) + (self.used - int(self.held.sum()))
                over = total > self.pool
                if over.any():
                    n_run = int(over.argmax()) + 1
                if n_run > 1:
                    need_last = need[n_run - 2]
            dts = dts[:n_run]
            end = float(starts[n_run - 1] + dts[-1])
        else:
            dts = np.array([a + c * c0])
            end = self.now + float(dts[0])
            need_last = None
        self.now = end
        last = n_run - 1
        gen = np.minimum(cum[last], rem)
        total_gen = int(gen.sum())
        self.ctx = ctx + gen
        self.rem = rem - gen
        if need_last is not None:
            grown = np.maximum(self.held, need_last)
            self.used += int((grown - self.held).sum())
            self.held = grown
        # counters and histograms
        stats.generation_tokens += total_gen + extra_gen
        step_tokens = per_step[:n_run].astype(float)
        # nobody finished before the last step, so only the last step's tokens are capped
        before_last = int(cum[last - 1].sum()) if last > 0 else 0
        step_tokens[last] = float(total_gen - before_last)
        step_tokens[0] += extra_gen + pf_tokens
        stats.iteration_tokens.observe_many(step_tokens)
        stats.itl.observe_many(dts, b)
        if k > 0 and accepted is not None:
            acc = accepted[:n_run]
            stats.drafts += n_run * b
            stats.draft_tokens += n_run * b * k
            stats.accepted += int(acc.sum())
            hist = np.bincount(acc.ravel(), minlength=k + 1)
            stats.accepted_per_pos[:k] += np.cumsum(hist[::-1])[::-1][1:]
            self.acc += acc.sum(axis=0)
            self.passes += n_run
        if stats.sglang:
            self._sglang_interval(dts, emitted[:n_run], gen, cum, last, k, total_gen, b)
        done = self.rem <= 0
        if done.any():
            idx = np.flatnonzero(done)
            for i in idx:
                req = self._write_back(int(i))
                self.used -= req.held
                self._finish(req)
            self._drop(~done)

    def _sglang_interval(
        self,
        dts: NDArray[np.float64],
        emitted: NDArray[np.int64],
        gen: NDArray[np.int64],
        cum: NDArray[np.int64],
        last: int,
        k: int,
        total_gen: int,
        b: int,
    ) -> None:
        """SGLang's token-weighted ITL and its per-interval spec/throughput gauges."""
        stats = self.stats
        weights = emitted.copy()
        weights[last] = gen - (cum[last - 1] if last > 0 else 0)
        weights = np.maximum(weights, 1)
        adjusted = dts[:, None] / weights
        stats.sg_itl.observe_many(adjusted.ravel(), weights.ravel(), float(dts.sum()) * b)
        stats.sg_interval_batches += len(dts)
        stats.sg_interval_tokens += total_gen
        if k > 0:
            stats.sg_interval_forwards += len(dts) * b
            stats.sg_interval_emitted += int(emitted[:last].sum()) + int(weights[last].sum())
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
        req = self.reqs[i]
        req.generated = req.output - int(self.rem[i])
        req.held = int(self.held[i])
        req.passes += int(self.passes[i])
        req.accepted += int(self.acc[i])
        return req

    def _drop(self, keep: NDArray[np.bool_]) -> None:
        self.reqs = [r for r, kept in zip(self.reqs, keep, strict=True) if kept]
        self.ctx = self.ctx[keep]
        self.rem = self.rem[keep]
        self.held = self.held[keep]
        self.passes = self.passes[keep]
        self.acc = self.acc[keep]
        self.surv = self.surv[keep]

    def _finish(self, req: Request) -> None:
        now = self.now
        stats = self.stats
        req.finish = now
        self.last_finish = now
        req.held = 0
        e2e = now - req.arrival
        queue = req.scheduled - req.arrival
        decode = now - req.first_token
        stats.e2e.observe(e2e)
        stats.queue.observe(queue)
        stats.inference.observe(now - req.scheduled)
        stats.prefill.observe(req.first_token - req.scheduled)
        stats.decode.observe(decode)
        if req.generated > 1:
            stats.tpot.observe(decode / (req.generated - 1))
        stats.req_prompt_tokens.observe(float(req.prompt))
        stats.req_generation_tokens.observe(float(req.generated))
        max_tokens = float(self._max_tokens[req.route])
        stats.req_max_generation_tokens.observe(max_tokens)
        stats.req_params_max_tokens.observe(max_tokens)
        stats.req_params_n.observe(1.0)
        stats.success["length" if req.length_capped else "stop"] += 1
        stats.num_requests += 1
        if stats.sglang:
            stats.sg_e2e.observe(e2e)
            stats.sg_queue.observe(queue)
        self.finished.append(req)
