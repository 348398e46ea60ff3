"""Everything the loops share: building the parts, warm start, publishing, eval, checkpoints.

`loop.py` and `loop_async.py` read top-down because the plumbing lives here. A `Pipeline`
holds handles (learner, fleet, registry, tasks, trackers, the gRPC service) and calls pure
functions; it owns no math.

Weight versions: version 0 is the model folder's weights, which every worker loads at start.
Each publish makes version + 1 (an Orbax snapshot under run_dir/weights, plus an HF export
for SGLang workers) and waits until every worker acknowledged it (DESIGN rule 5).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import time
import uuid
from typing import Any

import numpy as np
import yaml

from controller import config as config_lib
from controller import stats, warmstart
from controller.config import RunConfig
from controller.batching import make_minibatches
from controller.fleet import Fleet, GroupResult
from controller.judge import reward_hacking_warning
from controller.registry import EnvRegistry
from controller.report import write_report
from controller.service import RunStatus, serve_controller
from controller.tasks import TaskSource
from controller.tracker import load_history, ConsoleTracker, JsonlTracker, MultiTracker, TensorBoardTracker
from learner.learner import Learner
from learner.sharding import make_mesh
from model.hf_io import load_hf
from model.tokenizer import Tokenizer
from model.weights import WeightVersion, params_digest
from rollout.api import GroupRequest, SamplingParams, Trajectory
from sandbox import api as sandbox_api

logger = logging.getLogger(__name__)


def every(period: int, step: int, total: int) -> bool:
    """True after every `period`-th step and after the last one (period 0 disables)."""
    return period > 0 and ((step + 1) % period == 0 or step + 1 == total)


@dataclasses.dataclass
class Pipeline:
    config: RunConfig
    run_dir: pathlib.Path
    model_dir: pathlib.Path
    learner: Learner
    fleet: Fleet
    registry: EnvRegistry
    tasks: TaskSource
    tracker: MultiTracker
    status: RunStatus
    server: Any
    port: int
    version: WeightVersion
    tokenizer: Tokenizer | None = None
    step: int = 0
    resumed: bool = False
    rng: np.random.Generator = dataclasses.field(default_factory=lambda: np.random.default_rng(0))
    history: list[dict[str, float]] = dataclasses.field(default_factory=list)
    evals: dict[str, list[tuple[int, float]]] = dataclasses.field(default_factory=dict)
    staleness: dict[int, int] = dataclasses.field(default_factory=dict)
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)

    # -- building ----------------------------------------------------------------------------

    @classmethod
    def build(cls, config: RunConfig) -> Pipeline:
        run_dir = config.run_path
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config_lib.to_dict(config), sort_keys=False))
        env_spec = warmstart.default_env_spec(config.env)
        model_dir = warmstart.ensure_model(config.model, run_dir, env_spec)
        mesh = make_mesh(config.mesh or None)
        # The learner's logprobs must mean what the sampler's mean: the same temperature.
        config = dataclasses.replace(config, learner=dataclasses.replace(config.learner,
                                                                         temperature=config.data.temperature))
        registry = EnvRegistry()
        tasks = TaskSource(config.seed)
        checkpoints = run_dir / "checkpoints"
        start_step, resumed = 0, False
        if config.resume and Learner.latest_step(checkpoints) is not None:
            learner, extra = Learner.restore(checkpoints, mesh=mesh, config=config.learner)
            registry.load_state(extra["registry"])
            tasks.load_state(extra["tasks"], {s.name: s for s in registry.active_specs()})
            version = WeightVersion.from_dict(extra["weights"])
            start_step, resumed = int(extra["step"]), True
            logger.info("resumed at step %d (weights version %d) from %s", start_step, version.version, checkpoints)
        else:
            model_config, params = load_hf(model_dir)
            version = WeightVersion(version=0, step=0, location=str(model_dir), format="hf_safetensors",
                                    digest=params_digest(params), created_at=time.time())
            learner = Learner(config.learner, model_config, params, mesh)
            registry.submit(env_spec, step=0)
        status = RunStatus(total_steps=config.steps, mode=config.mode)
        server, port = serve_controller(registry, status, config.listen, security=config.security)
        logger.info("ControllerService listening on %s", f"{config.listen.rsplit(':', 1)[0]}:{port}")
        (run_dir / "controller.port").write_text(str(port))

        fleet = Fleet(config.fleet, model_dir, run_dir, seed=config.seed)
        try:
            fleet.start()
        except BaseException:
            fleet.close()  # no orphaned workers when one of them fails to come up
            server.stop(grace=0)
            raise
        status.update(rollout_workers=fleet.size)
        tracker = MultiTracker([JsonlTracker(run_dir), TensorBoardTracker(run_dir), ConsoleTracker(config.steps)])
        return cls(config, run_dir, model_dir, learner, fleet, registry, tasks, tracker, status, server, port,
                   version, tokenizer=Tokenizer.from_dir(model_dir), step=start_step, resumed=resumed,
                   rng=np.random.default_rng([config.seed, start_step]))

    def close(self) -> None:
        self.status.close()
        self.fleet.close()
        self.server.stop(grace=1.0)
        self.tracker.close()
        self.learner.close()

    # -- before RL ---------------------------------------------------------------------------

    def prepare(self) -> None:
        """Warm-start the policy on demonstrations (or resume), publish it, and measure where RL starts.

        The warm start uses its own optimiser (constant `warm_start.learning_rate`); RL then
        starts a fresh one whose reference policy is the warm-started model.
        """
        if not self.resumed and self.config.warm_start.steps > 0:
            self._warm_start()
        self.publish()
        if not self.resumed:
            self.summary["eval_before"] = self.evaluate(-1)

    def _warm_start(self) -> None:
        spec = self.registry.active_specs()[0]
        warm = self.config.warm_start
        demos = warmstart.demonstrations(self.model_dir, spec, self.tasks.train_tasks(spec))
        sft = Learner(dataclasses.replace(self.config.learner, loss="sft", learning_rate=warm.learning_rate,
                                          schedule="constant", kl_coef=0.0, warmup_steps=20),
                      self.learner.model_config, self.learner.params, self.learner.mesh)
        t0 = time.perf_counter()
        for i, batch in enumerate(warmstart.sft_batches(demos, warm, sft.row_multiple, self.config.seed)):
            metrics = sft.sft_step(batch)
            if (i + 1) % 25 == 0 or i + 1 == warm.steps:
                logger.info("warm start %d/%d: loss %.3f (%.0fs)", i + 1, warm.steps,
                            metrics.get("learner/loss", float("nan")), time.perf_counter() - t0)
            if i + 1 >= warm.min_steps and (i + 1 - warm.min_steps) % warm.check_every == 0 and i + 1 < warm.steps:
                self.publish(sft)  # RL should start as soon as some samples succeed, not later
                success = self._evaluate_env(spec, f"warm{i + 1}").get(f"eval/{spec.name}/success_rate", 0.0)
                logger.info("warm start %d: greedy eval success %.1f%%", i + 1, 100 * success)
                if success >= warm.target_success:
                    break
        self.learner.close()
        self.learner = Learner(self.config.learner, sft.model_config, sft.params, sft.mesh)
        sft.close()

    # -- per step ----------------------------------------------------------------------------

    def next_group_requests(self, n: int) -> list[GroupRequest]:
        data = self.config.data
        requests = []
        for spec in self.registry.sample(self.rng, n):
            task = self.tasks.next_task(spec)
            requests.append(GroupRequest(
                group_id=f"s{self.step}-{uuid.uuid4().hex[:8]}",
                env=spec, task=task, group_size=data.group_size,
                sampling=self._sampling(spec, data.temperature, data.top_p)))
        return requests

    def _sampling(self, spec: sandbox_api.EnvSpec, temperature: float, top_p: float) -> SamplingParams:
        overrides = spec.sampling
        return SamplingParams(
            temperature=temperature if overrides.temperature is None else overrides.temperature,
            top_p=top_p if overrides.top_p is None else overrides.top_p,
            top_k=0 if overrides.top_k is None else overrides.top_k,
            max_new_tokens=spec.budgets.max_new_tokens_per_turn,
            seed=int(self.rng.integers(1 << 31)))

    def collect(self, results: list[GroupResult | None]) -> tuple[list[list[Trajectory]], dict[str, int]]:
        """Scored trajectories per group, and infra errors by class (never rewards)."""
        groups, infra = [], {}
        for result in results:
            if result is None:
                continue
            for name, count in result.infra_errors.items():
                infra[name] = infra.get(name, 0) + count
            scored, errors = stats.split_infra(result.trajectories)
            for name, count in errors.items():
                infra[name] = infra.get(name, 0) + count
            if not result.trajectories:
                infra["group_dropped"] = infra.get("group_dropped", 0) + 1
            groups.append(scored)
            if scored:
                self.registry.record_results(result.request.env.name, sum(t.true_metric for t in scored), len(scored))
        return groups, infra

    def train(self, groups: list[list[Trajectory]]) -> tuple[dict[str, float], list[Trajectory]]:
        """One learner step on the step's scored groups: `data.minibatches` optimiser updates."""
        data = self.config.data
        plans = make_minibatches(groups, self.config.learner.advantage, self.learner.row_multiple,
                                 data.minibatches, data.skip_zero_advantage)
        t0 = time.perf_counter()
        updates = [self.learner.train_step(plan.batch) for plan in plans]
        train_s = time.perf_counter() - t0
        scored_groups = sum(1 for g in groups if g)
        trained_groups = sum(len({t.group_id for t in plan.trajectories}) for plan in plans)
        metrics = {
            "batch/groups": float(scored_groups),
            "batch/skipped_groups": float(scored_groups - trained_groups),
            "batch/updates": float(len(plans)),
            "perf/train_s": train_s,
            "perf/learner_tokens_per_s": sum(p.batch.num_policy_tokens for p in plans) / train_s if plans else 0.0,
        }
        for key in updates[0] if updates else ():
            if key.startswith("learner/"):
                metrics[key] = float(np.mean([u[key] for u in updates if key in u]))
        return metrics, [t for plan in plans for t in plan.trajectories]

    def publish(self, learner: Learner | None = None) -> float:
        """Snapshot the learner's weights as the next version and load it on every worker."""
        t0 = time.perf_counter()
        sglang = self.config.fleet.engine == "sglang"
        version = (learner or self.learner).publish(self.run_dir / "weights", self.version.version + 1,
                                       format="hf_safetensors" if sglang else "orbax",
                                       tokenizer_dir=self.model_dir if sglang else None)
        self.fleet.update_weights(version)
        self.version = version
        self.status.update(weights=version)
        return time.perf_counter() - t0

    def finish_step(self, step: int, metrics: dict[str, float], trained: list[Trajectory]) -> None:
        with open(self.run_dir / "trajectories.jsonl", "a") as log:
            for t in trained:  # what was trained on, with the versions of its tokens (staleness audits)
                versions = sorted({v for turn in t.policy_turns for v in turn.versions})
                log.write(json.dumps({
                    "step": step, "learner_version": self.version.version - 1, "trajectory_id": t.trajectory_id,
                    "group_id": t.group_id, "env": t.env_name, "task_id": t.task_id, "versions": versions,
                    "reward": t.reward, "true_metric": t.true_metric, "termination": t.termination.value,
                    "turns": len(t.policy_turns), "policy_tokens": t.num_policy_tokens}) + "\n")
        for age, count in stats.staleness_histogram(trained, self.version.version - 1).items():
            self.staleness[age] = self.staleness.get(age, 0) + count
        metrics = {k: float(v) for k, v in metrics.items()}
        self.history.append({"step": step, **metrics})
        self.tracker.log(step, metrics)
        self.status.log(step, metrics)  # the console tracker warns of reward hacking as it happens
        self.step = step + 1

    # -- periodic ----------------------------------------------------------------------------

    def evaluate(self, step: int) -> dict[str, float]:
        """Greedy success on each active env's eval split, reported apart from training."""
        results = {}
        for spec in self.registry.active_specs():
            metrics = self._evaluate_env(spec, f"step{step + 1}")
            if not metrics:
                continue
            results.update(metrics)
            success = metrics[f"eval/{spec.name}/success_rate"]
            self.evals.setdefault(spec.name, []).append((step, success))
            logger.info("eval after step %d on %s: success %.1f%% over %d tasks", step + 1, spec.name,
                        100 * success, metrics[f"eval/{spec.name}/count"])
        if step >= 0:
            self.tracker.log(step, results)
        return results

    def _evaluate_env(self, spec: sandbox_api.EnvSpec, tag: str) -> dict[str, float]:
        """Greedy rollouts of the first `eval.num_tasks` eval tasks on the current weights."""
        tasks = self.tasks.eval_tasks(spec, self.config.eval.num_tasks)
        if not tasks:
            return {}
        sampling = SamplingParams(temperature=0.0, max_new_tokens=spec.budgets.max_new_tokens_per_turn)
        requests = [GroupRequest(group_id=f"eval-{tag}-{i}", env=spec, task=task, group_size=1, sampling=sampling)
                    for i, task in enumerate(tasks)]
        groups, _ = self.collect(self.fleet.rollout(requests))
        scored = [t for g in groups for t in g]
        self._write_samples(f"eval-{spec.name}-{tag}", scored[:8])
        return stats.rollout_metrics(scored, self.version.version, prefix=f"eval/{spec.name}")

    def _write_samples(self, name: str, trajectories: list[Trajectory]) -> None:
        """A few episodes as text, for people: run_dir/samples/<name>.txt."""
        folder = self.run_dir / "samples"
        folder.mkdir(exist_ok=True)
        with open(folder / f"{name}.txt", "w") as out:
            for t in trajectories:
                ids = list(t.prompt_ids) + [i for turn in t.turns for i in turn.token_ids]
                out.write(f"=== {t.trajectory_id} task={t.task_id} reward={t.reward:.3f} "
                          f"true={t.true_metric:.0f} end={t.termination.value}\n{self.tokenizer.decode(ids)}\n\n")

    def checkpoint(self, step: int) -> None:
        self.learner.save(self.run_dir / "checkpoints", extra={
            "step": step + 1,
            "tasks": self.tasks.state(),
            "registry": self.registry.to_state(),
            "weights": self.version.to_dict(),
            "history_len": len(self.history),
        })

    # -- end ---------------------------------------------------------------------------------

    def summarise(self) -> dict[str, Any]:
        final = self.evaluate(self.step - 1) if self.config.steps and not every(
            self.config.eval.every, self.step - 1, self.config.steps) else {}
        name = self.registry.active_specs()[0].name
        curve = self.evals.get(name, [])
        before = curve[0][1] if curve else float("nan")
        after = curve[-1][1] if curve else float("nan")
        perf = [h for h in self.history if "perf/rollout_tokens_per_s" in h]
        summary = {
            "env": name,
            "eval_success_before": before,
            "eval_success_after": after,
            "eval_success_gain_pp": 100 * (after - before),
            "reward_mean_last": self.history[-1].get("reward/mean", float("nan")) if self.history else float("nan"),
            "reward_true_metric_corr_mean": _mean_defined(h.get("reward/true_metric_corr") for h in self.history),
            "rollout_tokens_per_s": float(np.mean([h["perf/rollout_tokens_per_s"] for h in perf])) if perf else 0.0,
            "learner_tokens_per_s": float(np.mean([h.get("perf/learner_tokens_per_s", 0.0) for h in perf])) if perf else 0.0,
            "weight_sync_s": float(np.mean([h.get("perf/weight_sync_s", 0.0) for h in perf])) if perf else 0.0,
            "steps": self.step,
            "reward_hacking_warning": reward_hacking_warning(self.history) or "",
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        report = write_report(self.run_dir, load_history(self.run_dir), summary, self.staleness)
        print(format_summary(summary, report))
        return summary


def _mean_defined(values) -> float:
    """Mean of the values that were logged (NaN when none were)."""
    defined = [v for v in values if v is not None]
    return float(np.mean(defined)) if defined else float("nan")


def format_summary(summary: dict[str, Any], report: pathlib.Path) -> str:
    gain = summary["eval_success_gain_pp"]
    verdict = ("RL raised held-out success by %.1f points" % gain) if gain > 0 else \
        ("held-out success did not rise (%.1f points)" % gain)
    rows = [
        ("env", summary["env"]),
        ("eval success before RL", f"{100 * summary['eval_success_before']:.1f}%"),
        ("eval success after RL", f"{100 * summary['eval_success_after']:.1f}%"),
        ("reward (last step)", f"{summary['reward_mean_last']:.3f}"),
        ("reward vs true metric corr", f"{summary['reward_true_metric_corr_mean']:.2f}"),
        ("rollout tokens/s", f"{summary['rollout_tokens_per_s']:.0f}"),
        ("learner tokens/s", f"{summary['learner_tokens_per_s']:.0f}"),
        ("weight sync (s)", f"{summary['weight_sync_s']:.2f}"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = ["", "=" * (width + 20), *[f"{k:<{width}}  {v}" for k, v in rows], "=" * (width + 20), verdict]
    if summary.get("reward_hacking_warning"):
        lines.append("WARNING: " + summary["reward_hacking_warning"])
    lines.append(f"report: {report}")
    return "\n".join(lines)
