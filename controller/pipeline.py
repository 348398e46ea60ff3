"""Everything the loops share: building the parts, warm start, publishing, eval, checkpoints.

`loop.py` and `loop_async.py` read top-down because the plumbing lives here. A `Pipeline`
holds handles (learner, fleet, registry, tasks, trackers, the gRPC service) and calls pure
functions; it owns no math.

Weight versions: version 0 is the model folder's weights, which every worker loads at start.
Each publish makes version + 1 (an Orbax snapshot under run_dir/weights, plus an HF export
for SGLang workers) and waits until every worker acknowledged it (DESIGN rule 5).

Checkpoints are the whole pipeline (DESIGN rule 6), one Orbax step folder per save, named by
the number of completed RL steps and renamed into place only when complete:
- `state`: the learner's TrainState (params, reference params, optimiser, RNG, step);
- `extra`: the task cursors with the ids consumed in the current pass, the env registry, the
  current WeightVersion, the count of groups issued (which seeds the next ones), the groups
  issued but not yet trained (in flight or buffered; re-issued on resume under the same ids),
  the byte length of metrics.jsonl and trajectories.jsonl, and the history behind the summary.
A resumed run cuts both files back to those lengths, deletes checkpoints and weight snapshots
newer than the one it resumed from (they belong to the abandoned run; controller/resume.py),
and brings every worker to the checkpoint's weight version before anything is rolled out.

Determinism: every random choice of a training group (its env, its sampling seed) comes from
an RNG keyed by (run seed, group index), never from wall-clock or completion order, and group
ids are the index. With workers that share a seed (spawned ones do), a synchronous run killed
at any moment and resumed repeats the uninterrupted run's groups exactly.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import pathlib
import time
from typing import Any

import numpy as np
import yaml

from controller import config as config_lib
from controller import resume, stats, warmstart
from controller.config import RunConfig
from controller.batching import make_minibatches
from controller.fleet import Fleet, GroupResult
from controller.judge import reward_hacking_warning
from controller.registry import EnvRegistry
from controller.resume import CHECKPOINT_FORMAT, STREAMS, ResumeError  # noqa: F401 (ResumeError: main.py)
from controller.report import write_report
from controller.service import RunStatus, serve_controller
from controller.tasks import TaskSource
from controller.tracker import load_history, ConsoleTracker, JsonlTracker, MultiTracker, TensorBoardTracker
from learner.learner import Learner
from learner.multihost import learner_type, stop_followers
from learner.sharding import make_mesh, select_devices
from model.hf_io import load_hf
from model.tokenizer import Tokenizer
from model.weights import WeightVersion, params_digest
from rollout.client import RolloutError
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
    groups_issued: int = 0
    """Training groups handed out so far; group `i` is `g{i}` and its random choices are keyed by (seed, i)."""
    pending: dict[str, GroupRequest] = dataclasses.field(default_factory=dict)
    """Groups handed out and not yet collected (in flight or finished but unread), by group id."""
    reissue: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """After a resume: the checkpoint's pending groups, handed out again (same ids) before new ones."""
    issue_errors: dict[str, int] = dataclasses.field(default_factory=dict)
    """Infra errors of groups that could not even be handed out (an env's task list unreachable);
    the next training `collect` reports them with its own."""
    history: list[dict[str, float]] = dataclasses.field(default_factory=list)
    evals: dict[str, list[tuple[int, float]]] = dataclasses.field(default_factory=dict)
    staleness: dict[int, int] = dataclasses.field(default_factory=dict)
    summary: dict[str, Any] = dataclasses.field(default_factory=dict)
    rl_started: float = 0.0
    """`time.perf_counter()` when this process began RL steps (after the warm start or restore)."""

    # -- building ----------------------------------------------------------------------------

    @classmethod
    def build(cls, config: RunConfig) -> Pipeline:
        run_dir = config.run_path
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(config_lib.to_dict(config), sort_keys=False))
        env_spec = warmstart.default_env_spec(config.env)
        model_dir = warmstart.ensure_model(config.model, run_dir, env_spec)
        mesh = make_mesh(config.mesh or None, devices=select_devices(config.devices.learner))
        # The learner's logprobs must mean what the sampler's mean: the same temperature. The
        # learner's checkpoint manager keeps what the run's checkpoint section says.
        config = dataclasses.replace(config, learner=dataclasses.replace(
            config.learner, temperature=config.data.temperature, checkpoint_keep=config.checkpoint.keep))
        registry = EnvRegistry(training_temperature=config.data.temperature)
        tasks = TaskSource(config.seed)
        checkpoints = run_dir / "checkpoints"
        restore_step = resume.resume_step(config, checkpoints)
        extra: dict[str, Any] = {}
        if restore_step is not None:
            learner, extra = learner_type().restore(checkpoints, mesh=mesh, step=restore_step, config=config.learner)
            registry.load_state(extra["registry"])
            tasks.load_state(extra["tasks"], {s.name: s for s in registry.active_specs()})
            version = WeightVersion.from_dict(extra["weights"])
            discarded = learner_type().discard_after(checkpoints, restore_step)
            resume.cut_streams(run_dir, extra.get("streams"))
            logger.info("resumed at step %d (weights version %d) from %s%s", int(extra["step"]), version.version,
                        checkpoints, f"; discarded newer checkpoints {discarded}" if discarded else "")
        else:
            resume.start_fresh(run_dir)
            model_config, params = load_hf(model_dir)
            version = WeightVersion(version=0, step=0, location=str(model_dir), format="hf_safetensors",
                                    digest=params_digest(params), created_at=time.time())
            learner = learner_type()(config.learner, model_config, params, mesh)
            registry.submit(env_spec, step=0)
        start_step = int(extra.get("step", 0))
        status = RunStatus(total_steps=config.steps, mode=config.mode)
        server, port = serve_controller(registry, status, config.listen, security=config.security)
        logger.info("ControllerService listening on %s", f"{config.listen.rsplit(':', 1)[0]}:{port}")
        (run_dir / "controller.port").write_text(str(port))

        fleet = Fleet(config.fleet, model_dir, run_dir, seed=config.seed, devices=config.devices)
        try:
            fleet.start()
        except BaseException:
            fleet.close()  # no orphaned workers when one of them fails to come up
            server.stop(grace=0)
            raise
        status.update(rollout_workers=fleet.size)
        fleet.on_change = lambda size: status.update(rollout_workers=size)  # DNS fleets grow and shrink
        tracker = MultiTracker([JsonlTracker(run_dir),
                                TensorBoardTracker(run_dir, purge_step=start_step if restore_step else None),
                                ConsoleTracker(config.steps)])
        pipe = cls(config, run_dir, model_dir, learner, fleet, registry, tasks, tracker, status, server, port,
                   version, tokenizer=Tokenizer.from_dir(model_dir), step=start_step,
                   resumed=restore_step is not None)
        if restore_step is not None:
            pipe._load_extra(extra)
        return pipe

    def _load_extra(self, extra: dict[str, Any]) -> None:
        """The loop-side state of a checkpoint (older formats lack some keys: those start empty)."""
        self.groups_issued = int(extra.get("groups_issued", 0))
        self.reissue = list(extra.get("pending", []))
        self.history = [dict(row) for row in extra.get("history", [])]
        self.evals = {name: [(int(s), float(v)) for s, v in curve] for name, curve in extra.get("evals", {}).items()}
        self.staleness = {int(age): int(count) for age, count in extra.get("staleness", {}).items()}
        if "eval_before" in extra:
            self.summary["eval_before"] = dict(extra["eval_before"])

    def close(self) -> None:
        self.status.close()
        self.fleet.close()
        self.server.stop(grace=1.0)
        self.tracker.close()
        self.learner.close()
        stop_followers()  # learner hosts of a multi-host learner leave with the controller

    # -- before RL ---------------------------------------------------------------------------

    def prepare(self) -> None:
        """Warm-start the policy on demonstrations (or resume), publish it, and measure where RL starts.

        The warm start uses its own optimiser (constant `warm_start.learning_rate`); RL then
        starts a fresh one whose reference policy is the warm-started model.
        """
        if self.resumed:
            self._restore_weights()
            self.rl_started = time.perf_counter()
            return
        started = time.perf_counter()
        if self.config.warm_start.steps > 0:
            self._warm_start()
        self.summary["warm_start_s"] = time.perf_counter() - started
        self.publish()
        self.summary["eval_before"] = self.evaluate(-1)
        self.rl_started = time.perf_counter()

    def _restore_weights(self) -> None:
        """Bring every worker to the checkpoint's weights before it serves anything.

        The checkpoint's version is sent again (same number, same digest, so the resumed run
        matches an uninterrupted one) when its snapshot is intact and holds the restored params.
        Otherwise, or when a re-attached worker already serves a higher version (one the killed
        controller published after the checkpoint), the restored params are published as a
        version above every version served, because workers never go back."""
        saved = self.version
        resume.discard_snapshots_after(self.run_dir / "weights", saved.version)
        served = [info.version for info in self._worker_infos()]
        intact = params_digest(self.learner.params) == saved.digest and resume.snapshot_holds(saved)
        if intact and max(served, default=0) <= saved.version:
            self.fleet.update_weights(saved)
            self.status.update(weights=saved)
            logger.info("workers serve the checkpoint's weights version %d", saved.version)
            return
        self.version = dataclasses.replace(saved, version=max([saved.version, *served]))
        self.publish()
        logger.info("restored weights republished as version %d (checkpoint had %d%s)", self.version.version,
                    saved.version, "" if intact else ", its snapshot was missing or differed")

    def _worker_infos(self) -> list:
        try:
            return self.fleet.infos()
        except RolloutError as error:  # an unreachable worker is revived by the weight update that follows
            logger.warning("could not ask every worker its version: %s", error)
            return []

    def _warm_start(self) -> None:
        spec = self.registry.active_specs()[0]
        warm = self.config.warm_start
        demos = warmstart.demonstrations(self.model_dir, spec, self.tasks.train_tasks(spec))
        sft = type(self.learner)(dataclasses.replace(self.config.learner, loss="sft", learning_rate=warm.learning_rate,
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
        self.learner = type(self.learner)(self.config.learner, sft.model_config, sft.params, sft.mesh)
        sft.close()

    # -- per step ----------------------------------------------------------------------------

    def next_group_requests(self, n: int) -> list[GroupRequest]:
        """`n` training groups: first any the checkpoint left pending (re-issued under their ids;
        all of them, even past `n`), then new ones, each keyed by its index (module docstring)."""
        requests = self._reissued()
        data = self.config.data
        rng = np.random.default_rng([self.config.seed, self.groups_issued])
        for spec in self.registry.sample(rng, max(0, n - len(requests))):
            index, self.groups_issued = self.groups_issued, self.groups_issued + 1
            seed = int(rng.integers(1 << 31))
            try:
                task = self.tasks.next_task(spec)
            except sandbox_api.EnvInfraError as error:  # its remote server cannot list tasks: no group this time
                logger.warning("group %d of env %r not handed out: %s", index, spec.name, error)
                for name in (error.error_class.value, "group_dropped"):
                    self.issue_errors[name] = self.issue_errors.get(name, 0) + 1
                continue
            requests.append(GroupRequest(
                group_id=f"s{self.step}-g{index}", env=spec, task=task,
                group_size=data.group_size, sampling=self._sampling(spec, seed)))
        for request in requests:
            self.pending[request.group_id] = request
        return requests

    def _reissued(self) -> list[GroupRequest]:
        specs = {spec.name: spec for spec in self.registry.active_specs()}
        requests, later = [], []
        for item in self.reissue:
            spec = specs.get(item["env"])
            if spec is None:  # removed or paused since: its group is not owed any more
                logger.warning("group %s of env %r is not re-issued: the env is not active", item["group_id"],
                               item["env"])
                continue
            try:
                task = self.tasks.find(spec, item["task_id"])
            except sandbox_api.EnvInfraError as error:  # its server is down: still owed, tried again next time
                logger.warning("group %s not re-issued yet: %s", item["group_id"], error)
                later.append(item)
                continue
            requests.append(GroupRequest(
                group_id=item["group_id"], env=spec, task=task,
                group_size=int(item["group_size"]), sampling=self._sampling(spec, int(item["seed"]))))
        self.reissue = later
        return requests

    def _sampling(self, spec: sandbox_api.EnvSpec, seed: int) -> SamplingParams:
        overrides, data = spec.sampling, self.config.data
        return SamplingParams(
            temperature=data.temperature if overrides.temperature is None else overrides.temperature,
            top_p=data.top_p if overrides.top_p is None else overrides.top_p,
            top_k=0 if overrides.top_k is None else overrides.top_k,
            max_new_tokens=spec.budgets.max_new_tokens_per_turn,
            seed=seed)

    def collect(self, results: list[GroupResult | None], training: bool = True
                ) -> tuple[list[list[Trajectory]], dict[str, int]]:
        """Scored trajectories per group, and infra errors by class (never rewards); a training
        collect also reports the groups that could not be handed out since the last one."""
        groups, infra = [], {}
        if training:
            infra, self.issue_errors = self.issue_errors, {}
        for result in results:
            if result is None:
                continue
            self.pending.pop(result.request.group_id, None)
            for name, count in result.infra_errors.items():
                infra[name] = infra.get(name, 0) + count
            # Samples in index order, not finishing order: the batch (and so the update) is reproducible.
            scored, errors = stats.split_infra(sorted(result.trajectories, key=_sample_order))
            for name, count in errors.items():
                infra[name] = infra.get(name, 0) + count
            if not scored:  # lost to infra errors whole (no attempt finished, or every sample failed)
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
        for key, count in stats.infra_metrics(self.fleet.drain_events()).items():  # restarts, failed updates
            metrics[key] = metrics.get(key, 0.0) + count
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
        try:
            tasks = self.tasks.eval_tasks(spec, self.config.eval.num_tasks)
        except sandbox_api.EnvInfraError as error:  # its remote server cannot list tasks: no measurement
            logger.warning("eval %s on %s skipped: %s", tag, spec.name, error)
            return {}
        if not tasks:
            return {}
        sampling = SamplingParams(temperature=0.0, max_new_tokens=spec.budgets.max_new_tokens_per_turn)
        requests = [GroupRequest(group_id=f"eval-{tag}-{i}", env=spec, task=task, group_size=1, sampling=sampling)
                    for i, task in enumerate(tasks)]
        groups, infra = self.collect(self.fleet.rollout(requests), training=False)
        scored = [t for g in groups for t in g]
        if not scored:  # every eval episode was lost to infra errors: no measurement, not a 0
            logger.warning("eval %s on %s: no episode finished (infra errors %s)", tag, spec.name, infra)
            return {}
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
        """Save the whole pipeline after `step` as checkpoint `step + 1` (module docstring)."""
        self.learner.save(self.run_dir / "checkpoints", step=step + 1, extra={
            "format": CHECKPOINT_FORMAT,
            "step": step + 1,
            "tasks": self.tasks.state(),
            "registry": self.registry.to_state(),
            "weights": self.version.to_dict(),
            "groups_issued": self.groups_issued,
            "pending": [{"group_id": r.group_id, "env": r.env.name, "task_id": r.task.task_id,
                         "group_size": r.group_size, "seed": r.sampling.seed} for r in self.pending.values()]
                       + self.reissue,  # owed from an earlier resume, not handed out yet
            "streams": {name: resume.length(self.run_dir / name) for name in STREAMS},
            "history": self.history,
            "evals": {name: [[s, v] for s, v in curve] for name, curve in self.evals.items()},
            "staleness": {str(age): count for age, count in self.staleness.items()},
            "eval_before": self.summary.get("eval_before", {}),
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
            "warm_start_s": float(self.summary.get("warm_start_s", 0.0)),
            "rl_wall_s": time.perf_counter() - self.rl_started if self.rl_started else 0.0,
            "reward_hacking_warning": reward_hacking_warning(self.history) or "",
        }
        (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        report = write_report(self.run_dir, load_history(self.run_dir), summary, self.staleness)
        print(format_summary(summary, report))
        return summary


def _sample_order(trajectory: Trajectory) -> tuple[int, str]:
    """Sort key of a group's samples: the sample index that ends the id (`group:attempt:index`)."""
    tail = trajectory.trajectory_id.rsplit(":", 1)[-1]
    return (int(tail) if tail.isdigit() else -1, trajectory.trajectory_id)


def _mean_defined(values) -> float:
    """Mean of the values that were logged (NaN when none were)."""
    defined = [v for v in values if v is not None]
    return float(np.mean(defined)) if defined else float("nan")


def format_summary(summary: dict[str, Any], report: pathlib.Path) -> str:
    gain = summary["eval_success_gain_pp"]
    minutes = summary.get("rl_wall_s", 0.0) / 60
    verdict = (f"RL raised held-out success by {gain:.1f} points in {minutes:.1f} min of RL") if gain > 0 else \
        (f"held-out success did not rise ({gain:.1f} points in {minutes:.1f} min of RL)")
    rows = [
        ("env", summary["env"]),
        ("eval success before RL", f"{100 * summary['eval_success_before']:.1f}%"),
        ("eval success after RL", f"{100 * summary['eval_success_after']:.1f}%"),
        ("reward (last step)", f"{summary['reward_mean_last']:.3f}"),
        ("reward vs true metric corr", f"{summary['reward_true_metric_corr_mean']:.2f}"),
        ("rollout tokens/s", f"{summary['rollout_tokens_per_s']:.0f}"),
        ("learner tokens/s", f"{summary['learner_tokens_per_s']:.0f}"),
        ("weight sync (s)", f"{summary['weight_sync_s']:.2f}"),
        ("warm start / RL wall (min)", f"{summary.get('warm_start_s', 0.0) / 60:.1f} / {summary.get('rl_wall_s', 0.0) / 60:.1f}"),
    ]
    width = max(len(k) for k, _ in rows)
    lines = ["", "=" * (width + 20), *[f"{k:<{width}}  {v}" for k, v in rows], "=" * (width + 20), verdict]
    if summary.get("reward_hacking_warning"):
        lines.append("WARNING: " + summary["reward_hacking_warning"])
    lines.append(f"report: {report}")
    return "\n".join(lines)
