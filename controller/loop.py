"""The synchronous single-controller loop: roll out, score, train, publish — one step at a time.

    policy (Flax, learner mesh, this process)
      -> Fleet: GRPO groups to rollout workers over gRPC (each runs the agent loop + sandbox)
      -> finished, scored, token-exact trajectories
      -> Pipeline.train: group advantages, loss mask from `token_stream` (controller/batching.py),
         then Learner.train_step (one jit, sharded), once per minibatch
      -> Learner.publish: Orbax snapshot + WeightVersion -> Fleet.update_weights
      -> metrics (Tracker), eval every N steps, pipeline checkpoint every M steps

Rollouts of step k all use version k, so staleness is 0 by construction; the asynchronous
schedule is the sibling `loop_async.py`. Everything that is not the loop (building parts,
warm start, evaluation, checkpoints) lives in `controller/pipeline.py`.
"""

from __future__ import annotations

import logging
import time

from controller import stats
from controller.config import RunConfig
from controller.pipeline import Pipeline, every

logger = logging.getLogger(__name__)


def run(config: RunConfig) -> dict[str, float]:
    pipe = Pipeline.build(config)
    try:
        pipe.prepare()  # warm start (or resume), publish the first version, eval before RL
        for step in range(pipe.step, config.steps):
            started = time.perf_counter()

            requests = pipe.next_group_requests(config.data.groups_per_step)
            t0 = time.perf_counter()
            results = pipe.fleet.rollout(requests)
            rollout_s = time.perf_counter() - t0
            groups, infra = pipe.collect(results)

            learner_metrics, trained = pipe.train(groups)

            sync_s = pipe.publish()

            scored = [t for g in groups for t in g]
            metrics = {
                **stats.rollout_metrics(scored, pipe.version.version - 1),
                **stats.infra_metrics(infra),
                **learner_metrics,
                "perf/rollout_tokens_per_s": sum(t.num_policy_tokens for t in scored) / max(rollout_s, 1e-9),
                "perf/rollout_s": rollout_s,
                "perf/weight_sync_s": sync_s,
                "perf/step_s": time.perf_counter() - started,
            }
            pipe.finish_step(step, metrics, trained)
            if every(config.eval.every, step, config.steps):
                pipe.evaluate(step)
            if every(config.checkpoint.every, step, config.steps):
                pipe.checkpoint(step)
        return pipe.summarise()
    finally:
        pipe.close()
