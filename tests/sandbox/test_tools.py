"""The calculator and the workspace file tools: correct, bounded, and never an escape hatch.

Proves: the calculator agrees with Python integer arithmetic on random expressions (hypothesis),
rejects everything that is not arithmetic (names, calls, attributes, `__import__('os')`) without
evaluating it, bounds huge powers before computing them; file tools refuse absolute paths,
`..` escapes and symlinks pointing outside, and write through no link. Pure Python, no sandbox.

Run: .venv/bin/python -m pytest tests/sandbox/test_tools.py -q
"""

from __future__ import annotations

import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sandbox import tools
from sandbox.tools import CalculatorError, OutsideWorkspaceError, calculate


@pytest.mark.parametrize("expression, value", [
    ("37 * 48", "1776"),
    ("12 + 34 * 56", "1916"),  # precedence: 34 * 56 = 1904, + 12
    ("(12 + 34) * 56", "2576"),
    ("7 // 2", "3"), ("-7 // 2", "-4"), ("7 % 3", "1"), ("2 ** 10", "1024"),
    ("10 / 4", "2.5"), ("6 / 3", "2"), ("-(3 - 5)", "2"), (" 1 +\t2 ", "3"), ("3 × 4", "12"),
])
def test_calculator_values(expression, value):
    assert calculate(expression) == value


_ints = st.integers(min_value=-10_000, max_value=10_000).map(str)


def _expressions(depth: int = 3):
    if depth == 0:
        return _ints
    sub = _expressions(depth - 1)
    return st.one_of(_ints, st.tuples(sub, st.sampled_from(["+", "-", "*"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"))


@settings(max_examples=200, deadline=None)
@given(_expressions())
def test_calculator_matches_python_integer_arithmetic(expression):
    assert calculate(expression) == str(eval(expression))  # reference only: test-generated input


@pytest.mark.parametrize("expression", [
    "__import__('os')", "__import__('os').system('id')", "open('/etc/passwd')", "x", "a.b", "(1).real",
    "[1, 2]", "lambda: 1", "1 if 1 else 2", "1 < 2", "'abc'", "1.5 + 1", "2 ^ 3", "1; 2", "", "1 +",
    "().__class__.__bases__[0].__subclasses__()",
])
def test_calculator_rejects_non_arithmetic(expression):
    with pytest.raises(CalculatorError):
        calculate(expression)


@pytest.mark.parametrize("expression", ["9 ** 9 ** 9", "10 ** 1000", "2 ** 100000", "(10 ** 150) * (10 ** 150)",
                                        "1" * 300, "1 / 0", "5 // 0", "5 % 0", "0 ** -1", "2 ** (1 / 2)",
                                        "+".join(["1"] * 200)])
def test_calculator_bounds_and_errors_fail_fast(expression):
    started = time.perf_counter()
    with pytest.raises(CalculatorError):
        calculate(expression)
    assert time.perf_counter() - started < 0.05


def test_calculator_is_microseconds():
    started = time.perf_counter()
    for _ in range(1000):
        calculate("(12 + 34) * 56")
    assert (time.perf_counter() - started) / 1000 < 1e-3


def test_file_tools_stay_inside_the_workspace(tmp_path):
    ws = tmp_path / "ws"
    ws.mkdir()
    (tmp_path / "secret").write_text("host secret")
    tools.write_file(ws, "a/b.txt", "hello", 1 << 20, None)
    assert tools.read_file(ws, "a/b.txt", 100) == "hello"
    assert tools.read_file(ws, "/workspace/a/b.txt", 100) == "hello"  # how the sandbox names it
    assert tools.list_files(ws, ".") == "a/b.txt"
    for bad in ("/etc/passwd", "../secret", "a/../../secret", "/workspace/../secret", "/workspacex/a"):
        with pytest.raises(OutsideWorkspaceError):
            tools.read_file(ws, bad, 100)
        with pytest.raises(OutsideWorkspaceError):
            tools.write_file(ws, bad, "x", 100, None)
    os.symlink(tmp_path / "secret", ws / "link")
    with pytest.raises(OutsideWorkspaceError):
        tools.read_file(ws, "link", 100)  # resolved before the check
    with pytest.raises(OutsideWorkspaceError):
        tools.write_file(ws, "link", "overwrite", 100, None)
    assert (tmp_path / "secret").read_text() == "host secret"


def test_write_file_refuses_oversized_content(tmp_path):
    with pytest.raises(ValueError, match="file limit"):
        tools.write_file(tmp_path, "big", "x" * 101, 100, None)


def test_read_file_truncates(tmp_path):
    (tmp_path / "f").write_text("x" * 50)
    assert tools.read_file(tmp_path, "f", 10) == "x" * 10 + "\n[truncated]"


def test_tool_specs_are_openai_functions():
    for spec in tools.TOOL_SPECS.values():
        shaped = spec.to_openai()
        assert shaped["type"] == "function" and shaped["function"]["name"] == spec.name
        params = shaped["function"]["parameters"]
        assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])
    assert tools.TOOL_SPECS["calculator"].parameters["required"] == ["expression"]
    assert tools.TOOL_SPECS["answer"].parameters["required"] == ["answer"]
    with pytest.raises(ValueError, match="unknown tool"):
        tools.default_tools(("calculator", "browser"))
