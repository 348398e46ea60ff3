"""RolloutWorker: one engine and the agent loop behind the `rollout.api.Rollout` role, in process.

What it is: what a rollout worker process serves. `rollout/service.py` exposes it over gRPC;
a controller may also hold one directly (no network) for local runs and tests. It bounds the
groups served at once (`RolloutConfig.max_concurrent_groups`), caps each group's deadline
(`group_deadline_s`), keeps an abort event per group in flight, and reports WorkerInfo.

What it is not: a scheduler of tasks (the controller decides what to roll out) nor a retry
policy (infra-error trajectories come back flagged; the controller retries or drops them).
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Iterator

from model.weights import WeightVersion
from rollout.agent import AgentLoop
from rollout.api import Engine, GroupRequest, Trajectory, WeightAck, WorkerInfo
from rollout.config import RolloutConfig

logger = logging.getLogger(__name__)


class WorkerBusyError(RuntimeError):
    """The worker already serves max_concurrent_groups groups."""


class RolloutWorker:
    """Implements `rollout.api.Rollout` on a local engine (see the module docstring)."""

    def __init__(self, engine: Engine, agent: AgentLoop, config: RolloutConfig = RolloutConfig()):
        self.engine, self.agent, self.config = engine, agent, config
        self._lock = threading.Lock()
        self._aborts: dict[str, list[threading.Event]] = collections.defaultdict(list)
        self._active = 0

    def rollout_group(self, request: GroupRequest, deadline_s: float,
                      abort: threading.Event | None = None) -> Iterator[Trajectory]:
        """Stream the group's trajectories as they finish; `abort` (or `abort(group_id)`)
        ends unfinished samples as ABORTED."""
        if request.group_size <= 0:
            raise ValueError(f"GroupRequest.group_size must be > 0, got {request.group_size}")
        abort = abort or threading.Event()
        with self._lock:
            if self._active >= self.config.max_concurrent_groups:
                raise WorkerBusyError(f"worker {self.config.worker_id} serves max_concurrent_"
                                      f"groups={self.config.max_concurrent_groups} already")
            self._active += 1
            self._aborts[request.group_id].append(abort)
        try:
            deadline = min(deadline_s, self.config.group_deadline_s)
            yield from self.agent.run_group(request, abort, deadline)
        finally:
            with self._lock:
                self._active -= 1
                events = self._aborts[request.group_id]
                events.remove(abort)
                if not events:
                    del self._aborts[request.group_id]

    def update_weights(self, version: WeightVersion, deadline_s: float) -> WeightAck:
        """Load and switch (the engine verifies the digest); raises if it cannot."""
        load_s = self.engine.load_weights(version)
        return WeightAck(self.config.worker_id, self.engine.version, load_s)

    def info(self, deadline_s: float = 0.0) -> WorkerInfo:
        stats = getattr(self.engine, "stats", {})
        return WorkerInfo(worker_id=self.config.worker_id,
                          engine=getattr(self.engine, "name", self.config.engine),
                          version=self.engine.version, healthy=self.healthy,
                          active_groups=self._active,
                          generated_tokens=int(stats.get("generated_tokens", 0)))

    @property
    def healthy(self) -> bool:
        return bool(getattr(self.engine, "healthy", True))

    def abort(self, group_id: str) -> int:
        """Abort the groups with this id ("" aborts every group); returns how many."""
        with self._lock:
            if group_id:
                events = list(self._aborts.get(group_id, ()))
            else:
                events = [e for es in self._aborts.values() for e in es]
        for event in events:
            event.set()
        return len(events)
