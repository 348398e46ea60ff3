"""learner: turns trajectories into a better policy, inside the controller process.

Modules (import them directly; this package imports nothing on its own):

- `learner.sharding`   mesh axes (data, fsdp, tensor), `make_mesh("data=2,fsdp=-1")`, the one
                       logical-axis rule table, parameter shardings; shape-letter key.
- `learner.config`     LearnerConfig: optimiser, objective, off-policy correction, numerics.
- `learner.api`        Batch: what the controller hands over (numpy [b, t], token-t aligned,
                       bucketed by `Batch.from_sequences`).
- `learner.advantages` group estimators by name (grpo, dr_grpo, rloo), all-equal groups,
                       per-turn discounted credit, GAE reference (numpy, controller side).
- `learner.loss`       LossInputs and objectives by name (grpo, ppo, reinforce, sft), KL
                       k1/k2/k3, entropy, TIS / decoupled importance, aggregation modes.
- `learner.state`      TrainState, AdamW + warm-up/cosine + clipping, state shardings.
- `learner.step`       pure `train_step` / `sft_step`: forward, loss, microbatch scan, update.
- `learner.learner`    Learner: the stateful shell (jit once, NaN stop, publish, Orbax
                       checkpoints with the controller's pipeline state, restore on any mesh).
- `learner.gpu`        XLA GPU flags (latency-hiding scheduler, collective overlap).

What it is not: the model (model/), rollout, or the loop (controller/). Learner imports
only model/.
"""
