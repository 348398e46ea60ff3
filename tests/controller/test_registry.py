"""EnvRegistry: submission rules, pause/resume/remove, mixture sampling, checkpoint state.

Proves that sampling draws ACTIVE envs in proportion to their mixture weights, deterministically
for a given numpy Generator, sees mid-run changes at the next call, and that to_state/from_state
survives JSON exactly. Run: `.venv/bin/python -m pytest tests/controller/test_registry.py`.
"""

import json
import threading

import numpy as np
import pytest

from controller.registry import DuplicateEnvError, EnvRegistry, EnvState, UnknownEnvError
from sandbox import api
from sandbox.validation import SpecError

KINDS = ("calc", "code", "files")


def spec(name, weight=1.0, **kw):
    return api.EnvSpec(name=name, kind="calc", args={"level": 1}, mixture_weight=weight, **kw)


def registry(*specs):
    r = EnvRegistry(known_kinds=KINDS)
    for s in specs:
        r.submit(s)
    return r


def test_submit_list_get_in_submission_order():
    r = registry(spec("b"), spec("a"))
    r.submit(spec("c"), step=7)
    assert [e.name for e in r.list()] == ["b", "a", "c"]
    c = r.get("c")
    assert (c.state, c.submitted_step, c.groups_sampled, c.success_rate) == (EnvState.ACTIVE, 7, 0, 0.0)
    assert c.spec == spec("c")


def test_invalid_spec_names_field_rule_value_and_is_not_added():
    r = registry()
    with pytest.raises(SpecError) as error:
        r.submit(spec("x", budgets=api.Budgets(max_turns=0)))
    assert str(error.value) == "EnvSpec.budgets.max_turns: must be an integer between 1 and 64, got 0"
    assert r.list() == []


def test_duplicate_without_replace_fails_with_the_name():
    r = registry(spec("calc-a"))
    with pytest.raises(DuplicateEnvError, match="'calc-a' is already registered"):
        r.submit(spec("calc-a", weight=2.0))
    assert r.get("calc-a").spec.mixture_weight == 1.0


def test_replace_keeps_place_resets_counters_and_activates():
    r = registry(spec("a"), spec("b"))
    r.sample(np.random.default_rng(0), 10)
    r.pause("a")
    replaced = r.submit(spec("a", weight=5.0), replace=True, step=3)
    assert (replaced.state, replaced.groups_sampled, replaced.submitted_step) == (EnvState.ACTIVE, 0, 3)
    assert replaced.spec.mixture_weight == 5.0
    assert [e.name for e in r.list()] == ["a", "b"]


def test_unknown_name_is_keyerror_listing_known_names():
    r = registry(spec("a"), spec("b"))
    for method in (r.get, r.pause, r.resume, r.remove):
        with pytest.raises(KeyError) as error:
            method("zzz")
        assert isinstance(error.value, UnknownEnvError)
        assert str(error.value) == "no env named 'zzz'; registered envs: 'a', 'b'"


def test_pause_resume_remove():
    r = registry(spec("a"), spec("b"))
    assert r.pause("a").state is EnvState.PAUSED
    assert r.pause("a").state is EnvState.PAUSED  # idempotent
    assert {s.name for s in r.sample(np.random.default_rng(0), 50)} == {"b"}
    assert r.resume("a").state is EnvState.ACTIVE
    assert r.remove("b").name == "b"
    assert [e.name for e in r.list()] == ["a"]
    assert {s.name for s in r.sample(np.random.default_rng(0), 50)} == {"a"}


def test_sample_follows_mixture_weights():
    r = registry(spec("light", 1.0), spec("heavy", 3.0))
    draws = r.sample(np.random.default_rng(123), 4000)
    share = sum(s.name == "heavy" for s in draws) / len(draws)
    # Expected 3/4; binomial sd = sqrt(0.75 * 0.25 / 4000) = 0.0068, so 5 sd = 0.034.
    assert abs(share - 0.75) < 0.034
    assert r.get("heavy").groups_sampled + r.get("light").groups_sampled == 4000
    assert r.get("heavy").groups_sampled == sum(s.name == "heavy" for s in draws)


def test_sample_is_deterministic_given_the_generator():
    a = [s.name for s in registry(spec("x"), spec("y", 2.0), spec("z", 0.5)).sample(np.random.default_rng(7), 64)]
    b = [s.name for s in registry(spec("x"), spec("y", 2.0), spec("z", 0.5)).sample(np.random.default_rng(7), 64)]
    assert a == b and len(set(a)) == 3


def test_env_submitted_mid_run_is_visible_to_next_sample():
    r = registry(spec("a"))
    rng = np.random.default_rng(0)
    assert {s.name for s in r.sample(rng, 20)} == {"a"}
    r.submit(spec("new", weight=1e6), step=5)  # overwhelming weight: every draw should be it
    assert {s.name for s in r.sample(rng, 20)} == {"new"}


def test_sample_with_nothing_active_is_empty():
    r = registry(spec("a"))
    r.pause("a")
    assert r.sample(np.random.default_rng(0), 4) == []
    assert registry().sample(np.random.default_rng(0), 4) == []


def test_record_results_and_success_rate():
    r = registry(spec("a"))
    assert r.record_results("a", successes=3, episodes=8)
    assert r.record_results("a", successes=1, episodes=2)
    assert r.get("a").success_rate == pytest.approx(0.4)  # (3 + 1) / (8 + 2)
    assert not r.record_results("gone", successes=1, episodes=1)
    with pytest.raises(ValueError):
        r.record_results("a", successes=3, episodes=2)


def test_state_round_trips_through_json_exactly():
    rich = api.EnvSpec(
        name="rich", kind="calc", args={"level": 3, "ratio": 0.25, "tags": ["x", "y"], "nested": {"k": 1.5}},
        tasks=(api.Task("t1", "What is 2+2?", verifier={"answer": 4}, split="eval", metadata={"src": "hand"}),),
        tools=(api.ToolSpec("calculator", "evaluate", {"type": "object"}, cost_per_call=0.5),),
        budgets=api.Budgets(max_turns=3, max_tool_cost=2.5),
        reward=api.RewardWeights(outcome=1.0, format=0.1, tool_cost=0.01),
        safety=api.SafetyPolicy(forbid_network=False, protected_paths=("a.txt",), stop_on_violation=False),
        sampling=api.SamplingOverrides(temperature=0.7, top_k=5),
        mixture_weight=2.5, eval_fraction=0.125,
    )
    r = registry(rich, spec("plain"))
    r.pause("plain")
    r.sample(np.random.default_rng(0), 5)
    r.record_results("rich", 2, 5)
    state = json.loads(json.dumps(r.to_state()))
    restored = EnvRegistry.from_state(state, known_kinds=KINDS)
    assert restored.list() == r.list()
    assert restored.get("rich").spec == rich
    # Same contents, same generator state -> same draws.
    assert restored.sample(np.random.default_rng(9), 16) == r.sample(np.random.default_rng(9), 16)


def test_concurrent_submits_are_all_kept():
    r = registry()

    def submit_many(prefix):
        for i in range(25):
            r.submit(spec(f"{prefix}-{i}"))
            r.sample(np.random.default_rng(i), 2)

    threads = [threading.Thread(target=submit_many, args=(p,)) for p in "abcd"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(r.list()) == 100


def test_temperature_override_must_match_the_learners():
    r = EnvRegistry(known_kinds=KINDS, training_temperature=1.0)
    r.submit(spec("unset"))
    r.submit(spec("same", sampling=api.SamplingOverrides(temperature=1.0, top_p=0.9)))
    with pytest.raises(SpecError) as error:
        r.submit(spec("hot", sampling=api.SamplingOverrides(temperature=1.5)))
    assert str(error.value) == ("EnvSpec.sampling.temperature: must be unset or equal the run's training "
                                "temperature 1 (the learner scores every sample at that temperature), got 1.5")
    assert [e.name for e in r.list()] == ["unset", "same"]
    # without a training temperature (a registry not attached to a learner) any valid value is kept
    EnvRegistry(known_kinds=KINDS).submit(spec("hot", sampling=api.SamplingOverrides(temperature=1.5)))
