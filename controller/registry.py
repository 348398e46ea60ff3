"""`EnvRegistry`: the environments clients submitted, their state, and the mixture the loop samples.

The registry is the controller's only record of what to train on. `ControllerService` writes to it
from gRPC threads while the loop reads it between steps, so every method takes one lock and returns
immutable snapshots (`EnvRecord`, `EnvSpec`); nobody outside holds a reference into its state.

It is not a task scheduler: it picks *which env* each GRPO group comes from; choosing the task
within an env (and generating a built-in kind's tasks) is the loop's job.

Invariants:
- Every spec in the registry passed `sandbox.validation.validate_env_spec` (at `submit`).
- `sample` draws only ACTIVE envs, in proportion to `EnvSpec.mixture_weight`, and is a pure
  function of (the registry's contents, the numpy Generator's state): same inputs, same draws.
  Order is submission order, so a resumed run draws the same envs as an uninterrupted one.
- An env submitted, paused, resumed or removed between two `sample` calls is seen by the second.
- `to_state()` is plain JSON; `from_state(to_state())` restores equal specs and counters
  (specs travel as the protobuf JSON mapping, `sandbox.wire.env_spec_to_json`).
"""

from __future__ import annotations

import dataclasses
import enum
import threading
from typing import Any, Iterable, Mapping

import numpy as np

from sandbox import api, validation, wire

STATE_FORMAT = 1  # bump when to_state's layout changes


class EnvState(enum.Enum):
    ACTIVE = "active"  # sampled for training
    PAUSED = "paused"  # kept (with its counters) but not sampled


class UnknownEnvError(KeyError):
    """No env of that name. The message lists the names that do exist."""

    def __str__(self) -> str:  # KeyError would show the message in quotes
        return str(self.args[0])


class DuplicateEnvError(ValueError):
    """An env of that name exists and the submission did not ask to replace it."""


@dataclasses.dataclass(frozen=True)
class EnvRecord:
    """A snapshot of one registered env, as `list`/`get` and the gRPC API report it."""

    spec: api.EnvSpec
    state: EnvState
    submitted_step: int  # learner step at which it was (last) submitted
    groups_sampled: int  # GRPO groups drawn from it by `sample`
    success_rate: float  # successful episodes / episodes recorded since submission (0 if none)

    @property
    def name(self) -> str:
        return self.spec.name


@dataclasses.dataclass
class _Entry:
    spec: api.EnvSpec
    state: EnvState
    submitted_step: int
    groups_sampled: int = 0
    episodes: int = 0
    successes: float = 0.0

    def record(self) -> EnvRecord:
        rate = self.successes / self.episodes if self.episodes else 0.0
        return EnvRecord(self.spec, self.state, self.submitted_step, self.groups_sampled, rate)


class EnvRegistry:
    """Thread-safe map from env name to spec, state and counters.

    `known_kinds` is passed to `validate_env_spec` (None: the built-in kinds of `sandbox.envs`,
    imported when the first spec is validated). `limits` caps what one client may submit; the
    gRPC service also uses it to size its message limit. `training_temperature`, when given,
    is the one temperature the learner scores samples at: a spec may leave
    `sampling.temperature` unset or set it to that value, nothing else (its samples' importance
    ratios and gradients would otherwise be computed for a distribution they were not drawn
    from).
    """

    def __init__(self, known_kinds: Iterable[str] | None = None,
                 limits: validation.SpecLimits = validation.SpecLimits(),
                 training_temperature: float | None = None):
        self.known_kinds = None if known_kinds is None else tuple(known_kinds)
        self.limits = limits
        self.training_temperature = training_temperature
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}  # insertion order = submission order

    # -- clients (via ControllerService) --------------------------------------------------------

    def submit(self, spec: api.EnvSpec, *, replace: bool = False, step: int = 0) -> EnvRecord:
        """Validate and add `spec`; raise `SpecError` if invalid, `DuplicateEnvError` if the name is taken.

        With `replace=True` an existing env of the same name gets the new spec, becomes ACTIVE,
        keeps its place in the sampling order and starts its counters again (it is a new env).
        """
        validation.validate_env_spec(spec, known_kinds=self.known_kinds, limits=self.limits)
        self._check_temperature(spec)
        with self._lock:
            if spec.name in self._entries and not replace:
                raise DuplicateEnvError(
                    f"env {spec.name!r} is already registered; remove it first or submit with replace=True")
            entry = _Entry(spec=spec, state=EnvState.ACTIVE, submitted_step=int(step))
            self._entries[spec.name] = entry
            return entry.record()

    def list(self) -> list[EnvRecord]:
        """All envs, ACTIVE and PAUSED, in submission order."""
        with self._lock:
            return [e.record() for e in self._entries.values()]

    def get(self, name: str) -> EnvRecord:
        with self._lock:
            return self._entry(name).record()

    def pause(self, name: str) -> EnvRecord:
        """Stop sampling `name` from the next `sample` call on. Pausing a paused env is a no-op."""
        return self._set_state(name, EnvState.PAUSED)

    def resume(self, name: str) -> EnvRecord:
        """Sample `name` again from the next `sample` call on. Resuming an active env is a no-op."""
        return self._set_state(name, EnvState.ACTIVE)

    def remove(self, name: str) -> EnvRecord:
        """Forget `name`; returns its last snapshot. Groups already in flight finish normally."""
        with self._lock:
            self._entry(name)
            return self._entries.pop(name).record()

    # -- the loop -------------------------------------------------------------------------------

    def sample(self, rng: np.random.Generator, n: int) -> list[api.EnvSpec]:
        """Draw `n` env specs (with replacement) by mixture weight among ACTIVE envs.

        Returns an empty list when no env is ACTIVE (the loop waits and polls). Each draw counts
        as one sampled group of that env.
        """
        if n < 0:
            raise ValueError(f"sample: n must be >= 0, got {n}")
        with self._lock:
            active = [e for e in self._entries.values() if e.state is EnvState.ACTIVE]
            if not active or n == 0:
                return []
            weights = np.array([e.spec.mixture_weight for e in active], dtype=np.float64)
            picks = rng.choice(len(active), size=n, p=weights / weights.sum())
            for i in picks:
                active[i].groups_sampled += 1
            return [active[i].spec for i in picks]

    def record_results(self, name: str, successes: float, episodes: int) -> bool:
        """Add `episodes` finished episodes of `name`, `successes` of them successful.

        Returns False (and records nothing) if `name` was removed meanwhile: results of groups
        sampled before a removal are dropped, not an error.
        """
        if episodes < 0 or not 0 <= successes <= episodes:
            raise ValueError(f"record_results: need 0 <= successes <= episodes, got {successes} of {episodes}")
        with self._lock:
            entry = self._entries.get(name)
            if entry is None:
                return False
            entry.episodes += int(episodes)
            entry.successes += float(successes)
            return True

    def active_specs(self) -> list[api.EnvSpec]:
        """The ACTIVE envs' specs in submission order (for evaluation on their eval splits)."""
        with self._lock:
            return [e.spec for e in self._entries.values() if e.state is EnvState.ACTIVE]

    # -- checkpoints ----------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        """Everything needed to restore the registry, as plain JSON types."""
        with self._lock:
            entries = list(self._entries.values())
        return {
            "format": STATE_FORMAT,
            "envs": [
                {
                    "spec": wire.env_spec_to_json(e.spec),
                    "state": e.state.value,
                    "submitted_step": e.submitted_step,
                    "groups_sampled": e.groups_sampled,
                    "episodes": e.episodes,
                    "successes": e.successes,
                }
                for e in entries
            ],
        }

    @classmethod
    def from_state(cls, state: Mapping[str, Any], known_kinds: Iterable[str] | None = None,
                   limits: validation.SpecLimits = validation.SpecLimits(),
                   training_temperature: float | None = None) -> "EnvRegistry":
        """A registry equal to the one `state` was taken from. Specs are validated again."""
        registry = cls(known_kinds=known_kinds, limits=limits, training_temperature=training_temperature)
        registry.load_state(state)
        return registry

    def load_state(self, state: Mapping[str, Any]) -> None:
        """Replace this registry's contents with `state` (from `to_state`)."""
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"registry state: format must be {STATE_FORMAT}, got {state.get('format')!r}")
        entries: dict[str, _Entry] = {}
        for item in state["envs"]:
            spec = wire.env_spec_from_json(item["spec"])
            validation.validate_env_spec(spec, known_kinds=self.known_kinds, limits=self.limits)
            self._check_temperature(spec)
            entries[spec.name] = _Entry(
                spec=spec, state=EnvState(item["state"]), submitted_step=int(item["submitted_step"]),
                groups_sampled=int(item["groups_sampled"]), episodes=int(item["episodes"]),
                successes=float(item["successes"]),
            )
        with self._lock:
            self._entries = entries

    # -- internals ------------------------------------------------------------------------------

    def _check_temperature(self, spec: api.EnvSpec) -> None:
        wanted, override = self.training_temperature, spec.sampling.temperature
        if wanted is not None and override is not None and abs(override - wanted) > 1e-6:
            raise validation.SpecError(
                "EnvSpec.sampling.temperature",
                f"must be unset or equal the run's training temperature {wanted:g} "
                f"(the learner scores every sample at that temperature)", override)

    def _entry(self, name: str) -> _Entry:
        """The entry for `name`; caller holds the lock."""
        entry = self._entries.get(name)
        if entry is None:
            known = ", ".join(repr(n) for n in self._entries) or "none"
            raise UnknownEnvError(f"no env named {name!r}; registered envs: {known}")
        return entry

    def _set_state(self, name: str, state: EnvState) -> EnvRecord:
        with self._lock:
            entry = self._entry(name)
            entry.state = state
            return entry.record()
