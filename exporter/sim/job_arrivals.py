"""Random job arrivals for the simulated cluster: who submits what, and when.

Jobs arrive as a Poisson process. Each team alternates between busy and quiet spells of a few
minutes; a busy team submits several times more than a quiet one, so teams take turns using
more than their nominal quota (borrowing from the cohort) and then reclaiming it, which is what
makes cohort preemptions happen. Everything is drawn from the simulation's seeded generator.
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from exporter.sim.hyperpod_layout import ClusterShape, JobTemplate, team_weights

SPELL_S = (240.0, 720.0)  # how long a busy or quiet spell lasts
BUSY_FACTOR = 3.0
QUIET_FACTOR = 0.4


@dataclass(frozen=True, slots=True)
class JobRequest:
    time: float
    team: str
    template: JobTemplate
    pods: int
    gpus_per_pod: int
    runtime: float


class JobArrivals:
    def __init__(
        self,
        shape: ClusterShape,
        mix: Sequence[JobTemplate],
        rng: random.Random,
        start: float,
    ) -> None:
        self._rng = rng
        self._mix = list(mix)
        self._teams = list(shape.teams)
        self._weights = team_weights(shape.teams)
        self._rate = shape.arrivals_per_minute / 60.0 if self._mix else 0.0
        self._busy = {team: rng.random() < 0.5 for team in self._teams}
        self._spell_ends = {team: start + rng.uniform(*SPELL_S) for team in self._teams}
        self._next = self._after(start)

    def sample(self, time: float) -> JobRequest | None:
        """One job as a team would submit it at `time` (None when there is no job mix)."""
        if not self._mix:
            return None
        scaled = [
            self._weights[t] * (BUSY_FACTOR if self._busy[t] else QUIET_FACTOR) for t in self._teams
        ]
        team = self._rng.choices(self._teams, weights=scaled)[0]
        template = self._rng.choices(self._mix, weights=[t.weight for t in self._mix])[0]
        return JobRequest(
            time=time,
            team=team,
            template=template,
            pods=self._rng.randint(*template.pods),
            gpus_per_pod=self._rng.choice(template.gpus_per_pod),
            runtime=self._rng.uniform(*template.runtime),
        )

    def until(self, now: float) -> Iterator[JobRequest]:
        """The jobs submitted after the last call, up to and including `now`, in time order."""
        while True:
            team = min(self._teams, key=lambda t: (self._spell_ends[t], t))
            if min(self._spell_ends[team], self._next) > now:
                return
            if self._spell_ends[team] <= self._next:
                self._busy[team] = not self._busy[team]
                self._spell_ends[team] += self._rng.uniform(*SPELL_S)
                continue
            job = self.sample(self._next)
            self._next = self._after(self._next)
            if job is not None:
                yield job

    def _after(self, t: float) -> float:
        return t + self._rng.expovariate(self._rate) if self._rate > 0 else float("inf")
