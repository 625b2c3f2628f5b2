"""The CPU a node spends making a content usable after its bytes arrive, as processor sharing.

Bytes arriving is not the end of a launch: an image is unpacked (or served
through FUSE), an environment installed (or restored), a checkpoint read. A
content kind may say how many CPU-seconds that takes per node (`cpu`, and
`cpu_origin_only` for today's baseline, whose work differs: unpacking and pip
instead of serving and restoring). The node is ready for that content when
the work is done.

The work runs on a pool of `cores`: each node's own (a real cluster), or one
pool all nodes share (`shared`: a testbed of namespaces on one host, where the
eight nodes of `bootseer bench launch` share two cores). A pool is processor
sharing: k jobs on c cores each run at min(1, c/k) of a core. No I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass

Job = tuple[int, int]  # (node, content)
EPSILON_S = 1e-6  # CPU-seconds: float error over hours of virtual time stays below


@dataclass(frozen=True, slots=True)
class CpuSpec:
    cores: float = 1.0
    shared: bool = False  # one pool for every node instead of one per node


class CpuPool:
    """Jobs sharing `cores`; the caller asks when the next one ends and settles it then."""

    __slots__ = ("_jobs", "_last", "cores", "generation")

    def __init__(self, cores: float) -> None:
        self.cores = cores
        self._jobs: dict[Job, float] = {}  # job -> CPU-seconds left
        self._last = 0.0
        self.generation = 0  # bumped whenever the next end may have moved

    def add(self, now: float, job: Job, work_s: float) -> None:
        self._advance(now)
        self._jobs[job] = work_s
        self.generation += 1

    def next_end(self) -> float | None:
        """When the job with the least work left ends, if nothing is added before."""
        if not self._jobs:
            return None
        return self._last + min(self._jobs.values()) / self._rate()

    def finish(self, now: float) -> list[Job]:
        """The jobs done by `now`, removed from the pool."""
        self._advance(now)
        done = [job for job, left in self._jobs.items() if left <= EPSILON_S]
        for job in done:
            del self._jobs[job]
        self.generation += 1
        return done

    def _rate(self) -> float:
        return min(1.0, self.cores / len(self._jobs))

    def _advance(self, now: float) -> None:
        if self._jobs and now > self._last:
            spent = (now - self._last) * self._rate()
            for job in self._jobs:
                self._jobs[job] -= spent
        self._last = max(self._last, now)
