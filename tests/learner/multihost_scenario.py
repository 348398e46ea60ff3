"""A learner scenario run the same way by one process or by process 0 of several.

`run(learner_cls, workdir)`: build a learner on a data=2,fsdp=4 mesh (with a KL reference,
so reference parameters cross too), two RL steps, logprobs, publish, checkpoint, restore
onto an fsdp=8 mesh, one more step. Returns what tests/learner/test_multihost.py compares.

As a program (`python tests/learner/multihost_scenario.py --coordinator ... --out x.npz`) it is
process 0 of a multi-process learner; the others run `python -m learner.host`.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT)]


def run(learner_cls, workdir: pathlib.Path) -> dict[str, np.ndarray]:
    import jax

    from tests.learner.helpers import random_batch, tiny_model_config
    from learner.config import LearnerConfig
    from learner.sharding import make_mesh
    from model import decoder

    model_config = tiny_model_config()
    params = jax.device_get(decoder.init_params(model_config, jax.random.PRNGKey(0)))
    config = LearnerConfig(learning_rate=1e-2, kl_coef=0.05, async_checkpoint=True)
    learner = learner_cls(config, model_config, params, make_mesh("data=2,fsdp=4"), ref_params=params)
    losses = [learner.train_step(random_batch(rows=8, seed=i))["learner/loss"] for i in range(2)]
    logprobs = learner.compute_logprobs(random_batch(rows=8, seed=5))
    version = learner.publish(workdir / "weights", version=1)
    learner.save(workdir / "ckpt", extra={"cursor": 7})
    learner.close()
    restored, extra = learner_cls.restore(workdir / "ckpt", mesh=make_mesh("fsdp=8"))
    losses.append(restored.train_step(random_batch(rows=8, seed=2))["learner/loss"])
    final = restored.params
    restored.close()
    out = {"losses": np.array(losses), "logprobs": logprobs, "cursor": np.array(extra["cursor"]),
           "step": np.array(restored.step), "published": np.array(str(version.location)),
           "digest": np.array(version.digest)}
    for i, leaf in enumerate(jax.tree.leaves(final)):
        out[f"final{i}"] = np.asarray(leaf)
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--coordinator", required=True)
    p.add_argument("--num-processes", type=int, required=True)
    p.add_argument("--local-cpu-devices", type=int, required=True)
    p.add_argument("--workdir", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    import logging

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    from learner import multihost
    from learner.config import DistributedConfig

    multihost.initialize(DistributedConfig(coordinator=args.coordinator, num_processes=args.num_processes,
                                           process_id=0, local_cpu_devices=args.local_cpu_devices,
                                           timeout_s=240))
    try:
        out = run(multihost.learner_type(), pathlib.Path(args.workdir))
    finally:
        multihost.stop_followers()
    np.savez(args.out, **out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
