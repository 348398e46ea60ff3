"""The run's configuration: one frozen dataclass per concern, composed into `RunConfig`.

Sources, later wins: the defaults below (the embedded CPU demo), a YAML file (`--config`),
dotted overrides (`learner.learning_rate=1e-4`), then the explicit command-line flags.
Each package owns its own config (`learner.config.LearnerConfig`, `rollout.config.*`,
`sandbox.config.SandboxConfig`); this module only composes them and adds the loop's own knobs.
Fields that change compiled shapes (and so force recompiles) say so.
"""

from __future__ import annotations

import dataclasses
import pathlib
import types
import typing
from typing import Any, Mapping

import yaml

from learner.config import DistributedConfig, LearnerConfig
from orrery.security import ClientSecurity, ServerSecurity, check_listen


@dataclasses.dataclass(frozen=True)
class ModelSetup:
    """Which policy to train. Empty `path` makes (once, cached in the run dir) a tiny model."""

    path: str = ""
    """An HF folder (config.json, safetensors, tokenizer.json); empty = the built-in tiny model."""
    hidden_size: int = 128
    """Tiny model only: width."""
    num_layers: int = 4
    """Tiny model only: decoder layers."""
    num_heads: int = 4
    """Tiny model only: query heads."""
    num_kv_heads: int = 2
    """Tiny model only: key/value heads (grouped-query attention)."""
    vocab_size: int = 384
    """Tiny model only: BPE vocabulary target, trained on the built-in envs' text."""
    seed: int = 0
    """Tiny model only: initialisation seed."""


@dataclasses.dataclass(frozen=True)
class FleetConfig:
    """The rollout workers the controller drives."""

    workers: int = 2
    """Local rollout worker processes to spawn (ignored when `addresses` is given)."""
    addresses: tuple[str, ...] = ()
    """host:port of running rollout workers; when set, nothing is spawned."""
    engine: str = "jax"
    """Engine of spawned workers: 'jax' (embedded, default) or 'sglang'."""
    slots: int = 32
    """Decode slots per spawned JAX worker (recompiles the worker's engine)."""
    groups_per_worker: int = 8
    """Groups one worker runs at once; more wait in the controller (workers refuse the excess)."""
    rollout_deadline_s: float = 300.0
    """Longest one group may take before it is abandoned as an infra error and retried."""
    call_deadline_s: float = 120.0
    """Deadline of UpdateWeights and GetInfo calls."""
    start_timeout_s: float = 180.0
    """Longest a spawned worker may take to report its port."""
    max_group_retries: int = 2
    """Times a group lost to an infra error is retried on another worker before it is dropped."""
    dns: str = ""
    """name:port whose address records are the workers (e.g. a Kubernetes headless service), re-resolved
    every `dns_interval_s`: workers join and leave while the run goes on. Excludes `addresses`."""
    dns_interval_s: float = 10.0
    """Seconds between DNS lookups of `dns`."""
    security: ClientSecurity = ClientSecurity()
    """How to reach `addresses` workers: their CA (TLS), a client certificate, the token file (role
    internal). Spawned workers get a fresh token of their own (docs/threat-model.md)."""


@dataclasses.dataclass(frozen=True)
class DeviceConfig:
    """Which of this host's accelerators the learner and each spawned rollout worker take.

    Indices count this host's devices (`jax.local_devices()` order, which is CUDA's order on GPUs).
    Sets must not overlap unless `colocate` is on; then the learner and the engines share devices
    and their memory (docs/operations.md: device allocation). Empty = no pinning: the learner takes
    every local device and workers see what the environment gives them."""

    learner: tuple[int, ...] = ()
    """Local device indices the learner mesh is built on; empty = all (the mesh spec must fit them)."""
    rollout: tuple[tuple[int, ...], ...] = ()
    """One set per spawned rollout worker (e.g. [[4, 5], [6, 7]]), handed to it as CUDA_VISIBLE_DEVICES;
    as many sets as `fleet.workers`. SGLang servers run beside workers get the same variable from whoever
    starts them (deploy/k8s: one GPU request per pod)."""
    colocate: bool = False
    """Allow the learner's and the workers' sets to overlap (they take turns; weights and caches of both
    stay resident)."""

    def check(self, workers: int, spawned: bool) -> None:
        """Errors name the field and the devices at fault."""
        sets = {"learner": self.learner, **{f"rollout[{i}]": s for i, s in enumerate(self.rollout)}}
        for name, ids in sets.items():
            if any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
                raise ValueError(f"DeviceConfig.{name} must hold device indices >= 0, got {list(ids)}")
            if len(set(ids)) != len(ids):
                raise ValueError(f"DeviceConfig.{name} names a device twice: {list(ids)}")
            if name != "learner" and not ids:
                raise ValueError(f"DeviceConfig.{name} must name at least one device")
        for i, a in enumerate(self.rollout):
            for j in range(i + 1, len(self.rollout)):
                shared = sorted(set(a) & set(self.rollout[j]))
                if shared:
                    raise ValueError(f"DeviceConfig.rollout[{i}] and rollout[{j}] share devices {shared}: "
                                     f"two engines on one device do not fit; give each worker its own")
            shared = sorted(set(a) & set(self.learner))
            if shared and not self.colocate:
                raise ValueError(f"DeviceConfig.rollout[{i}] and learner share devices {shared}; set "
                                 f"devices.colocate=true to share them on purpose (docs/operations.md)")
        if self.rollout and not spawned:
            raise ValueError("DeviceConfig.rollout pins spawned workers only; with fleet.addresses or fleet.dns "
                             "the workers' own hosts decide their devices")
        if self.rollout and len(self.rollout) != workers:
            raise ValueError(f"DeviceConfig.rollout has {len(self.rollout)} device sets for fleet.workers={workers}; "
                             f"give one set per worker")


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """What each step rolls out."""

    groups_per_step: int = 16
    """GRPO groups (prompts) per learner step."""
    group_size: int = 8
    """Samples per prompt."""
    temperature: float = 0.7
    """Sampling temperature of training rollouts; the learner's importance ratios use the same. The demo's
    warm-started policy is broad (greedy solves 57% of held-out tasks, sampling at 1.0 only ~5%): at 0.7
    about 27% of samples succeed, so most groups carry signal from the first step."""
    top_p: float = 1.0
    """Nucleus sampling of training rollouts."""
    skip_zero_advantage: bool = True
    """Drop groups whose samples all scored the same: they carry no GRPO signal."""
    minibatches: int = 1
    """Optimiser updates per step, each on a share of the step's groups (PPO-style reuse of one rollout)."""


@dataclasses.dataclass(frozen=True)
class WarmStartConfig:
    """A short supervised phase on env demonstrations before RL (0 steps disables it)."""

    steps: int = 600
    """Most supervised steps (the phase usually ends earlier, at `target_success`)."""
    min_steps: int = 50
    """Supervised steps before the first early-stop check."""
    batch_size: int = 32
    """Demonstrations per supervised step."""
    learning_rate: float = 1e-3
    """Supervised learning rate (constant). On the demo 1e-3 learns the format, copying and the operator
    by ~140 steps; 3e-3 thrashed (the operator flipped between `+` and `*` from check to check) and RL
    then collapsed every product to a sum."""
    target_success: float = 0.35
    """Stop once greedy eval success reaches this: RL needs sampled successes, and should do the rest.
    The demo's success jumps within ~10 steps (15% at step 130, 57% at 140); RL from the 15% model
    found almost no sampled successes and stayed flat."""
    check_every: int = 10
    """Supervised steps between early-stop checks."""


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    every: int = 5
    """Learner steps between evaluations on each env's eval split (greedy)."""
    num_tasks: int = 200
    """Eval tasks per env (the first N of its eval split; the demo's split has 200). At 64 one eval's
    standard error was ~6 points, as large as the effects being measured."""


@dataclasses.dataclass(frozen=True)
class CheckpointConfig:
    every: int = 10
    """Learner steps between pipeline checkpoints (0 disables)."""
    keep: int = 3
    """Checkpoints kept on disk."""


@dataclasses.dataclass(frozen=True)
class EnvConfig:
    """The env the run starts with; clients may submit more over gRPC while it runs."""

    kind: str = "calc"
    """Built-in env kind."""
    level: int = 1
    """Difficulty level of the built-in env."""
    num_tasks: int = 4000
    """Generated tasks (train and eval together)."""
    eval_fraction: float = 0.05
    """Share of tasks held out as the eval split."""
    max_turns: int = 3
    """Policy turns per episode."""
    max_new_tokens_per_turn: int = 40
    """Tokens the policy may sample in one turn."""
    max_total_tokens: int = 256
    """Prompt plus all turns; also bounds the learner's sequence length (and so its compiled shapes)."""
    process_reward: float = 0.0
    """Weight of the env's process component (calc: how much of the task's expression the calculator
    call reproduces) in the training reward; the outcome weighs 1.0 and the answer-tool format 0.1.
    Off by default: on the demo, 0.3 made every group informative (more learner work per step) and
    held-out success rose no faster than with the outcome alone."""
    tool_delay_s: float = 0.0
    """Simulated latency of each calculator call in seconds (calc env arg; 0 = none, for benchmarks)."""
    slow_fraction: float = 0.0
    """Share of calculator calls that are slow (deterministic per task and call)."""
    slow_factor: float = 0.0
    """A slow call sleeps this many times `tool_delay_s` (a heavy tail, e.g. 10)."""


@dataclasses.dataclass(frozen=True)
class RunConfig:
    run_dir: str = "runs/default"
    """Where the model, checkpoints, weight snapshots, metrics and report go."""
    steps: int = 40
    """Learner steps of RL."""
    mode: str = "sync"
    """'sync': roll out, then train, then publish. 'async': rollouts continue while the learner trains."""
    max_staleness: int = 1
    """Async mode: a sample is admitted only if every token's weight version is within this many versions of the learner's."""
    mesh: str = ""
    """Learner mesh, e.g. 'data=1,fsdp=-1'; empty uses all local devices on fsdp."""
    listen: str = "127.0.0.1:0"
    """Address of ControllerService (loopback by default; port 0 picks a free one)."""
    seed: int = 0
    """Seed of task sampling, the learner and the workers."""
    resume: bool = False
    """Continue from a checkpoint in run_dir (the latest unless `resume_step` names one); without one, start fresh."""
    resume_step: int = -1
    """With `resume`: the checkpoint (completed RL steps) to continue from; -1 = the latest. Newer ones are discarded."""
    model: ModelSetup = ModelSetup()
    fleet: FleetConfig = FleetConfig()
    data: DataConfig = DataConfig()
    warm_start: WarmStartConfig = WarmStartConfig()
    eval: EvalConfig = EvalConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()
    env: EnvConfig = EnvConfig()
    devices: DeviceConfig = DeviceConfig()
    distributed: DistributedConfig = DistributedConfig()
    """Multi-host learner: this controller is process 0 of `num_processes` (learner hosts run
    `python -m learner.host`); the mesh then spans every process's devices."""
    security: ServerSecurity = ServerSecurity()
    """ControllerService's TLS, tokens file and submission rate limit; listening beyond loopback needs
    TLS and a tokens file (orrery/security.py, docs/threat-model.md)."""
    learner: LearnerConfig = LearnerConfig(learning_rate=2e-4, advantage="dr_grpo")
    """The demo's RL learner, tuned on calc. Advantages are Dr. GRPO's (group mean removed, no division
    by the group's std): with GRPO's std scaling a group whose samples differ only in the 0.1 format
    reward gets the same full-size update as one that differs in success, and from the same warm start
    held-out success fell from 57% to 27% in 5 steps where Dr. GRPO rose to 67%. lr 5e-5 moved
    success ~3 points in 20 steps; 2e-4 is the fastest that stayed stable."""

    def __post_init__(self) -> None:
        if self.mode not in ("sync", "async"):
            raise ValueError(f"RunConfig.mode must be one of ['sync', 'async'], got {self.mode!r}")
        if self.max_staleness < 0:
            raise ValueError(f"RunConfig.max_staleness must be >= 0, got {self.max_staleness}")
        if self.resume_step < -1:
            raise ValueError(f"RunConfig.resume_step must be a checkpoint step >= 0 or -1 (the latest), "
                             f"got {self.resume_step}")
        if self.steps < 0:
            raise ValueError(f"RunConfig.steps must be >= 0, got {self.steps}")
        if self.fleet.engine not in ("jax", "sglang"):
            raise ValueError(f"FleetConfig.engine must be one of ['jax', 'sglang'], got {self.fleet.engine!r}")
        if self.fleet.engine == "sglang" and not (self.fleet.addresses or self.fleet.dns):
            raise ValueError("FleetConfig.engine 'sglang': the controller does not launch SGLang servers yet; start "
                             "`python -m rollout.server --engine sglang --sglang-url URL` beside each server and pass "
                             "--rollout-addresses or --rollout-dns")
        if self.fleet.dns and self.fleet.addresses:
            raise ValueError(f"FleetConfig.dns and addresses exclude each other, got dns={self.fleet.dns!r} "
                             f"and addresses={list(self.fleet.addresses)}")
        if self.fleet.dns:
            host, sep, port = self.fleet.dns.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"FleetConfig.dns must be name:port (e.g. rollout.orrery.svc.cluster.local:50051), "
                                 f"got {self.fleet.dns!r}")
        if not self.fleet.dns_interval_s > 0:
            raise ValueError(f"FleetConfig.dns_interval_s must be > 0, got {self.fleet.dns_interval_s}")
        if self.distributed.process_id != 0:
            raise ValueError(f"DistributedConfig.process_id of the controller must be 0 (learner hosts are "
                             f"1..n-1), got {self.distributed.process_id}")
        remote = bool(self.fleet.addresses or self.fleet.dns)
        self.devices.check(self.fleet.workers, spawned=not remote)
        if not remote and self.fleet.workers < 1:
            raise ValueError(f"FleetConfig.workers must be >= 1 when no addresses are given, got {self.fleet.workers}")
        check_listen("ControllerService", self.listen, self.security)  # a refused address: one line, before anything starts

    @property
    def run_path(self) -> pathlib.Path:
        return pathlib.Path(self.run_dir)


def load(path: str | None = None, overrides: tuple[str, ...] = (), **flags: Any) -> RunConfig:
    """Build a RunConfig from defaults, an optional YAML file, dotted overrides and flags."""
    tree: dict[str, Any] = {}
    if path:
        loaded = yaml.safe_load(pathlib.Path(path).read_text()) or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"--config {path}: the top level must be a mapping, got {type(loaded).__name__}")
        tree = loaded
    for item in overrides:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"override {item!r}: must be dotted.key=value")
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {item!r}: {part!r} is not a section")
        node[leaf] = yaml.safe_load(value)
    for key, value in flags.items():
        if value is None:
            continue
        node = tree
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return build(RunConfig, tree, "config")


def build(cls: type, tree: Mapping[str, Any], where: str) -> Any:
    """Instantiate the dataclass `cls` from a nested mapping, checking keys and types."""
    if not isinstance(tree, Mapping):
        raise ValueError(f"{where}: must be a mapping, got {tree!r}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(tree) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown}; valid keys are {sorted(fields)}")
    kwargs = {name: _coerce(hints[name], value, f"{where}.{name}") for name, value in tree.items()}
    return cls(**kwargs)


def _coerce(hint: Any, value: Any, where: str) -> Any:
    if dataclasses.is_dataclass(hint):
        return build(hint, value, where)
    origin = typing.get_origin(hint)
    if origin is tuple:
        items = value if isinstance(value, (list, tuple)) else [v for v in str(value).split(",") if v]
        (item_type, *_rest) = typing.get_args(hint) or (Any,)
        return tuple(_coerce(item_type, v, where) for v in items)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        return None if value is None else _coerce(options[0], value, where)
    if hint in (int, float) and isinstance(value, str):
        try:
            value = hint(value)  # YAML reads 1e-4 (no dot) as a string
        except ValueError:
            raise ValueError(f"{where}: must be {hint.__name__}, got {value!r}") from None
    if hint is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if hint in (int, float, str, bool) and not isinstance(value, hint):
        raise ValueError(f"{where}: must be {hint.__name__}, got {value!r}")
    return value


def to_dict(config: Any) -> dict[str, Any]:
    """The config as plain data (for the run dir's config.yaml and the report)."""
    return dataclasses.asdict(config)
