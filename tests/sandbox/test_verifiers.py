"""Verifiers run in killable workers: right answers, and hangs or crashes become infra errors in time.

Proves: math-verify equivalence (LaTeX vs plain), exact and regex matches; a verifier that sleeps,
a catastrophic regex, a pathological math-verify input, a worker that dies and a verifier that
raises all end within their deadline (plus startup slack) as EnvInfraError(VERIFIER_TIMEOUT /
VERIFIER_CRASH), never as a False that would be scored 0; the worker pool recovers afterwards.

Run: .venv/bin/python -m pytest tests/sandbox/test_verifiers.py -q
"""

from __future__ import annotations

import time

import pytest

from sandbox import verifiers
from sandbox.api import EnvInfraError, InfraErrorClass

SLACK_S = 2.0  # killing and reaping the worker


@pytest.fixture(scope="module", autouse=True)
def warm_workers():
    verifiers.prewarm(1)
    yield
    verifiers.shutdown()


@pytest.mark.parametrize("gold, answer, equal", [
    ("\\frac{1}{2}", "0.5", True),
    ("42", "The answer is $42$.", True),
    ("42", "\\boxed{41}", False),
    ("x^2 + 2x + 1", "$(x+1)^2$", True),
    ("3", "", False),
])
def test_math_equal(gold, answer, equal):
    assert verifiers.math_equal(gold, answer, timeout_s=20) is equal


def test_exact_and_regex_match():
    assert verifiers.exact_match("done", "  done\n") and not verifiers.exact_match("done", "Done")
    assert verifiers.regex_match(r"\d+ files?", "3 files", timeout_s=10)
    assert not verifiers.regex_match(r"\d+ files?", "three files", timeout_s=10)


def expect_infra(error_class: InfraErrorClass, fn, *args, timeout_s: float):
    started = time.monotonic()
    with pytest.raises(EnvInfraError) as caught:
        verifiers.call(fn, *args, timeout_s=timeout_s)
    assert caught.value.error_class is error_class
    assert time.monotonic() - started < timeout_s + SLACK_S
    return caught.value


def test_sleeping_verifier_times_out():
    expect_infra(InfraErrorClass.VERIFIER_TIMEOUT, "time:sleep", 60, timeout_s=1.0)


def test_catastrophic_regex_times_out():
    started = time.monotonic()
    with pytest.raises(EnvInfraError) as caught:
        verifiers.regex_match(r"(a+)+b", "a" * 40, timeout_s=1.0)
    assert caught.value.error_class is InfraErrorClass.VERIFIER_TIMEOUT
    assert time.monotonic() - started < 1.0 + SLACK_S


def test_pathological_math_input_ends_within_the_deadline():
    """A power tower 2^2^2^2^2^2 = 2^(2^65536) makes sympy compute forever; our deadline decides."""
    started = time.monotonic()
    with pytest.raises(EnvInfraError) as caught:
        verifiers.math_equal("2", "$2^{2^{2^{2^{2^{2}}}}}$", timeout_s=2.0)
    assert caught.value.error_class is InfraErrorClass.VERIFIER_TIMEOUT
    assert time.monotonic() - started < 2.0 + SLACK_S


def test_dying_worker_is_a_crash():
    expect_infra(InfraErrorClass.VERIFIER_CRASH, "os:_exit", 3, timeout_s=10.0)


def test_raising_verifier_is_a_crash_with_the_traceback():
    error = expect_infra(InfraErrorClass.VERIFIER_CRASH, "math:sqrt", -1.0, timeout_s=10.0)
    assert "ValueError" in str(error)


def test_workers_recover_after_failures():
    expect_infra(InfraErrorClass.VERIFIER_TIMEOUT, "time:sleep", 60, timeout_s=0.5)
    assert verifiers.call("math:gcd", 12, 18, timeout_s=20) == 6


def test_local_functions_are_refused():
    def local(x):
        return x
    with pytest.raises(ValueError, match="module-level"):
        verifiers.call(local, 1, timeout_s=1)
