"""Open-loop traffic: Poisson arrivals under the scenario's load profile, and the requests.

The fleet pulls arrivals from a :class:`Traffic` one at a time, in time order, and routes
each to a replica. Every stochastic choice comes from its own seeded generator — arrival
times, the route of each arrival, and each route's token counts — so a change in one place
(say, a route-mix event) does not shift the draws of another, and the same seed gives the
same requests whatever arm the replicas run. Each request also carries a uniform
"difficulty" quantile from which the serving replica derives its acceptance rate, so one
request is equally hard for every arm (common random numbers for the oracle).
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from spectune.sim.scenario import (
    FixedTokens,
    LoadEvent,
    LoadPoint,
    LogNormalTokens,
    Scenario,
    TokenDist,
    dist_upper,
)

__all__ = ["LoadProfile", "Request", "Traffic"]


class Request:
    """One request's static draw and its mutable progress inside an engine.

    Internal to the simulator (engine and fleet mutate it); the outside world sees
    :class:`spectune.sim.fleet.RequestRecord` once the request is finished.
    """

    __slots__ = (
        "alpha",
        "arrival",
        "computed",
        "finish",
        "first_token",
        "generated",
        "held",
        "id",
        "joined_clock",
        "length_capped",
        "output",
        "passes",
        "preemptions",
        "prompt",
        "route",
        "scheduled",
        "to_compute",
        "u_alpha",
    )

    def __init__(
        self,
        rid: int,
        arrival: float,
        route: int,
        prompt: int,
        output: int,
        u_alpha: float,
        length_capped: bool,
    ) -> None:
        self.id = rid
        self.arrival = arrival
        self.route = route
        self.prompt = prompt
        self.output = output
        self.u_alpha = u_alpha
        self.length_capped = length_capped
        self.alpha = 0.0
        self.scheduled = -1.0
        self.first_token = -1.0
        self.finish = -1.0
        self.generated = 0
        self.computed = 0
        self.to_compute = prompt
        self.held = 0
        self.preemptions = 0
        self.passes = 0
        self.joined_clock = 0


@dataclass(frozen=True)
class _Piece:
    start: float
    rate: float
    ramp_to: float | None
    over_s: float | None

    def rate_at(self, t: float) -> float:
        if self.ramp_to is None or self.over_s is None:
            return self.rate
        frac = min(max((t - self.start) / self.over_s, 0.0), 1.0)
        return self.rate + (self.ramp_to - self.rate) * frac

    def bound(self) -> float:
        return max(self.rate, self.ramp_to if self.ramp_to is not None else 0.0)


class LoadProfile:
    """Offered load (requests per second) over time: piecewise constant or linear ramps."""

    def __init__(self, points: Sequence[LoadPoint | LoadEvent], scale: float = 1.0) -> None:
        ordered = sorted(enumerate(points), key=lambda p: (p[1].at_s, p[0]))
        self._pieces = [
            _Piece(
                p.at_s,
                p.requests_per_s * scale,
                None if p.ramp_to is None else p.ramp_to * scale,
                p.over_s,
            )
            for _, p in ordered
        ]
        if not self._pieces or self._pieces[0].start > 0:
            self._pieces.insert(0, _Piece(0.0, 0.0, None, None))

    def piece_index(self, t: float) -> int:
        """Index of the piece in force at time ``t``."""
        i = 0
        while i + 1 < len(self._pieces) and self._pieces[i + 1].start <= t:
            i += 1
        return i

    def rate_at(self, t: float) -> float:
        """Offered requests per second at time ``t``."""
        return self._pieces[self.piece_index(t)].rate_at(t)

    def end_of(self, i: int) -> float:
        """When piece ``i`` ends (infinity for the last)."""
        return self._pieces[i + 1].start if i + 1 < len(self._pieces) else math.inf

    def piece(self, i: int) -> _Piece:
        """Piece ``i``."""
        return self._pieces[i]


class Traffic:
    """The fleet's arrival stream: call :meth:`peek` for the next time, :meth:`pop` to take it."""

    def __init__(
        self,
        scenario: Scenario,
        seed: np.random.SeedSequence,
        *,
        load_scale: float = 1.0,
    ) -> None:
        self._scenario = scenario
        streams = seed.spawn(3 + len(scenario.routes))
        self._arrival_rng = np.random.default_rng(streams[0])
        self._route_rng = np.random.default_rng(streams[1])
        self._alpha_rng = np.random.default_rng(streams[2])
        self._token_rngs = [np.random.default_rng(s) for s in streams[3:]]
        loads: list[LoadPoint | LoadEvent] = list(scenario.load)
        loads += [e for e in scenario.events if isinstance(e, LoadEvent)]
        self.profile = LoadProfile(loads, load_scale)
        self._shares = [r.share for r in scenario.routes]
        self._cumulative = list(itertools.accumulate(self._shares))
        self._max_len = scenario.max_model_len
        self._next_id = 0
        self._t = 0.0
        self._next = self._draw_next(0.0)

    def set_shares(self, shares: Mapping[str, float]) -> None:
        """Apply a route-mix change: listed routes take the new share, others keep theirs."""
        for i, r in enumerate(self._scenario.routes):
            if r.name in shares:
                self._shares[i] = shares[r.name]
        self._cumulative = list(itertools.accumulate(self._shares))

    def peek(self) -> float:
        """Time of the next arrival (infinity if the load is zero from here on)."""
        return self._next

    def pop(self) -> Request:
        """Take the next arrival as a :class:`Request` and draw the one after it."""
        t = self._next
        cumulative = self._cumulative
        total = cumulative[-1]
        route = 0
        if total > 0 and len(cumulative) > 1:
            route = min(
                bisect.bisect_right(cumulative, self._route_rng.random() * total),
                len(cumulative) - 1,
            )
        r = self._scenario.routes[route]
        rng = self._token_rngs[route]
        prompt, _ = _draw_tokens(r.prompt_tokens, rng)
        output, capped = _draw_tokens(r.output_tokens, rng)
        # vLLM rejects prompts that do not fit; the simulator trims them so every request
        # is served, and caps the output at the context limit (finish reason "length").
        prompt = min(prompt, self._max_len - 1)
        if prompt + output > self._max_len:
            output = self._max_len - prompt
            capped = True
        req = Request(
            self._next_id,
            t,
            route,
            prompt,
            output,
            float(self._alpha_rng.random()),
            capped,
        )
        self._next_id += 1
        self._next = self._draw_next(t)
        return req

    def _draw_next(self, t: float) -> float:
        # Thinning per piece: candidates at the piece's peak rate, kept with rate(t)/peak.
        profile = self.profile
        i = profile.piece_index(t)
        while True:
            piece = profile.piece(i)
            end = profile.end_of(i)
            peak = piece.bound()
            if peak <= 0:
                if math.isinf(end):
                    return math.inf
                t, i = end, i + 1
                continue
            t = t + float(self._arrival_rng.exponential(1.0 / peak))
            if t >= end:
                t, i = end, i + 1
                continue
            if piece.ramp_to is None or float(self._arrival_rng.random()) * peak <= piece.rate_at(
                t
            ):
                return t


def _draw_tokens(dist: TokenDist, rng: np.random.Generator) -> tuple[int, bool]:
    """One token count, clipped to ``[1, max]``; also whether the clip cut it short."""
    upper = dist_upper(dist)
    if isinstance(dist, LogNormalTokens):
        mu = math.log(dist.mean) - dist.sigma * dist.sigma / 2.0
        raw = round(math.exp(mu + dist.sigma * float(rng.standard_normal())))
    elif isinstance(dist, FixedTokens):
        raw = dist.value
    else:
        raw = int(rng.integers(dist.low, dist.high + 1))
    value = min(max(int(raw), 1), upper)
    return value, raw > upper
