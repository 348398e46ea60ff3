"""The asynchronous loop: rollouts keep going while the learner trains.

The sibling of `loop.py`, one difference: the fleet always has `groups_per_step` groups in
flight, topped up the moment one finishes, so generation overlaps training and weight sync.
A finished group is admitted into the step's batch only if every policy token of every
sample was made by a weight version within `max_staleness` of the learner's current version
(checked per sample from the per-token versions); older samples are dropped and counted
(`staleness/dropped`). What is admitted may be a few versions old, so the learner corrects
with the behaviour logprobs (`learner.importance`: truncated importance weights or the
decoupled objective).

Workers switch weights between requests (drain) unless configured to interrupt, so one turn
may still carry two versions; the per-token check handles both.

On resume the groups that were in flight or finished-but-unread at the checkpoint are handed
out again first (`Pipeline.next_group_requests`), so none is lost and none is trained twice.
A group that cannot be handed out (its env's task list is unreachable) leaves a gap the loop
fills on its next pass, so the fleet never runs dry waiting for it.
"""

from __future__ import annotations

import concurrent.futures
import logging
import queue
import time

from controller import stats
from controller.config import RunConfig
from controller.pipeline import Pipeline, every
from rollout.api import Trajectory

logger = logging.getLogger(__name__)


def admit(group: list[Trajectory], version: int, max_staleness: int) -> tuple[list[Trajectory], int]:
    """Samples whose oldest token is within `max_staleness` versions of `version`, and the drop count."""
    fresh = [t for t in group if version - t.min_version() <= max_staleness]
    return fresh, len(group) - len(fresh)


def run(config: RunConfig) -> dict[str, float]:
    pipe = Pipeline.build(config)
    finished: queue.Queue[concurrent.futures.Future] = queue.Queue()
    in_flight = 0

    def top_up() -> None:
        """Keep `groups_per_step` groups in flight while the step fills and trains."""
        nonlocal in_flight
        for request in pipe.next_group_requests(config.data.groups_per_step - in_flight):
            in_flight += 1
            pipe.fleet.submit(request).add_done_callback(finished.put)

    try:
        pipe.prepare()
        top_up()
        for step in range(pipe.step, config.steps):
            started = time.perf_counter()

            groups, infra, dropped, partial, waited = [], {}, 0, 0, 0.0
            while len(groups) < config.data.groups_per_step:
                t0 = time.perf_counter()
                try:
                    future = finished.get(timeout=1.0)
                except queue.Empty:
                    top_up()  # a group could not be handed out before: try again
                    continue
                finally:
                    waited += time.perf_counter() - t0
                in_flight -= 1
                top_up()
                scored, errors = pipe.collect([future.result()])
                for name, count in errors.items():
                    infra[name] = infra.get(name, 0) + count
                fresh, stale = admit(scored[0] if scored else [], pipe.version.version, config.max_staleness)
                dropped += stale
                if len(fresh) == config.data.group_size:
                    groups.append(fresh)
                else:  # a group short of samples (stale or infra-lost) would bias its advantages
                    partial += 1

            learner_metrics, trained = pipe.train(groups)

            sync_s = pipe.publish()

            scored = [t for g in groups for t in g]
            step_s = time.perf_counter() - started
            metrics = {
                **stats.rollout_metrics(scored, pipe.version.version - 1),
                **stats.infra_metrics(infra),
                **learner_metrics,
                "staleness/dropped": float(dropped),
                "batch/dropped_partial_groups": float(partial),
                "perf/rollout_wait_s": waited,
                "perf/rollout_tokens_per_s": sum(t.num_policy_tokens for t in scored) / max(step_s, 1e-9),
                "perf/weight_sync_s": sync_s,
                "perf/step_s": step_s,
            }
            pipe.finish_step(step, metrics, trained)
            if every(config.eval.every, step, config.steps):
                pipe.evaluate(step)
            if every(config.checkpoint.every, step, config.steps):
                pipe.checkpoint(step)
        return pipe.summarise()
    finally:
        pipe.close()
