"""The tools agents call: their JSON-Schema specs, the safe calculator and the workspace file tools.

Tools and where they run:
- `calculator`: pure Python in this process. The expression is parsed with `ast` and only
  integer literals, + - * / // % ** (bounded), unary +/- and parentheses are evaluated; nothing is
  ever exec'd or eval'd. Microseconds per call, no sandbox: the demo env stays fast.
- `read_file`, `write_file`, `list_files`: in this process, confined to the workspace. A path is
  resolved (symlinks included) before the check, so a link pointing outside is refused. Nothing
  from the sandbox runs between two calls (the warm server kills every leftover process after
  each call), so there is no window to swap a checked path for a link.
- `python`, `shell`: inside the sandbox (`sandbox/isolation.py`), through a pool lease.
- `answer`: submits the final answer and ends the episode.

Specs are `ToolSpec`s in the OpenAI function-calling shape; the default costs below are per call
and per second of wall time and can be overridden per env (`EnvSpec.tools`).
"""

from __future__ import annotations

import ast
import fractions
import os
from pathlib import Path

from sandbox.api import ToolSpec

WORKSPACE_MOUNT = "/workspace"  # where the workspace appears inside the sandbox


def _spec(name: str, description: str, properties: dict, required: list[str], cost_per_call: float,
          cost_per_second: float = 0.0) -> ToolSpec:
    schema = {"type": "object", "properties": properties, "required": required, "additionalProperties": False}
    return ToolSpec(name, description, schema, cost_per_call, cost_per_second)


_STR = {"type": "string"}
TOOL_SPECS: dict[str, ToolSpec] = {
    "calculator": _spec("calculator", "Evaluate integer arithmetic: + - * / // % ** and parentheses.",
                        {"expression": {**_STR, "description": "e.g. (12 + 7) * 3"}}, ["expression"], 0.01),
    "python": _spec("python", "Run a Python 3 program in the workspace; returns stdout and stderr.",
                    {"code": {**_STR, "description": "the program's source"}}, ["code"], 0.1, 0.05),
    "shell": _spec("shell", "Run a /bin/sh command in the workspace; returns stdout and stderr.",
                   {"command": {**_STR, "description": "e.g. ls -la"}}, ["command"], 0.1, 0.05),
    "read_file": _spec("read_file", "Read a text file from the workspace.",
                       {"path": {**_STR, "description": "workspace-relative path"}}, ["path"], 0.02),
    "write_file": _spec("write_file", "Create or overwrite a text file in the workspace.",
                        {"path": {**_STR, "description": "workspace-relative path"}, "content": _STR},
                        ["path", "content"], 0.02),
    "list_files": _spec("list_files", "List files under a workspace directory, recursively.",
                        {"path": {**_STR, "description": "workspace-relative directory, default ."}}, [], 0.02),
    "answer": _spec("answer", "Submit your final answer; ends the episode.", {"answer": _STR}, ["answer"], 0.0),
}
SANDBOXED_TOOLS = frozenset({"python", "shell"})
FILE_TOOLS = frozenset({"read_file", "write_file", "list_files"})


def default_tools(names: tuple[str, ...]) -> tuple[ToolSpec, ...]:
    unknown = [n for n in names if n not in TOOL_SPECS]
    if unknown:
        raise ValueError(f"unknown tool names {unknown}; valid: {sorted(TOOL_SPECS)}")
    return tuple(TOOL_SPECS[n] for n in names)


# ---------------------------------------------------------------------------------------------
# calculator


class CalculatorError(ValueError):
    """The expression is malformed, unsupported or out of bounds (an agent error, shown to it)."""


MAX_EXPRESSION_CHARS = 256
MAX_NODES = 128
MAX_EXPONENT = 256
MAX_DIGITS = 200  # bound on |value| (10**200) for every intermediate result

_BINARY = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%", ast.Pow: "**"}


def _bounded(x: fractions.Fraction) -> fractions.Fraction:
    if abs(x.numerator) >= 10 ** MAX_DIGITS or x.denominator >= 10 ** MAX_DIGITS:
        raise CalculatorError(f"result exceeds 10**{MAX_DIGITS}")
    return x


def _power(base: fractions.Fraction, exponent: fractions.Fraction) -> fractions.Fraction:
    if exponent.denominator != 1:
        raise CalculatorError("exponent must be an integer")
    e = exponent.numerator
    if abs(e) > MAX_EXPONENT:
        raise CalculatorError(f"exponent {e} exceeds {MAX_EXPONENT}")
    if base == 0 and e < 0:
        raise CalculatorError("division by zero")
    # Reject before computing: digits(base**e) ~ |e| * digits(base).
    size = max(len(str(abs(base.numerator))), len(str(base.denominator)))
    if abs(e) * (size - 1) > MAX_DIGITS:
        raise CalculatorError(f"result exceeds 10**{MAX_DIGITS}")
    return _bounded(base ** e)


def _eval(node: ast.AST) -> fractions.Fraction:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return _bounded(fractions.Fraction(node.value))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        op = type(node.op)
        if op in (ast.Div, ast.FloorDiv, ast.Mod) and right == 0:
            raise CalculatorError("division by zero")
        if op is ast.Add:
            return _bounded(left + right)
        if op is ast.Sub:
            return _bounded(left - right)
        if op is ast.Mult:
            return _bounded(left * right)
        if op is ast.Div:
            return _bounded(left / right)
        if op is ast.FloorDiv:
            return fractions.Fraction(left // right)
        if op is ast.Mod:
            return _bounded(left % right)
        return _power(left, right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        raise CalculatorError("unsupported operator ^ (use ** for powers)")
    if isinstance(node, ast.Constant):
        raise CalculatorError(f"only integers are allowed, got {node.value!r}")
    raise CalculatorError(f"unsupported syntax: {type(node).__name__}")


def format_number(x: fractions.Fraction) -> str:
    """Integers print exactly ("1776"); other rationals as a 12-significant-digit decimal."""
    return str(x.numerator) if x.denominator == 1 else f"{x.numerator / x.denominator:.12g}"


def calculate(expression: str) -> str:
    """Evaluate `expression` safely and return the value as text. Raises CalculatorError."""
    if not isinstance(expression, str):
        raise CalculatorError("expression must be a string")
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise CalculatorError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    text = expression.strip().replace("×", "*").replace("÷", "/")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as e:
        raise CalculatorError(f"syntax error: {e.msg}") from None
    if sum(1 for _ in ast.walk(tree)) > MAX_NODES:
        raise CalculatorError(f"expression has more than {MAX_NODES} parts")
    return format_number(_eval(tree.body))


# ---------------------------------------------------------------------------------------------
# workspace file tools


class OutsideWorkspaceError(ValueError):
    """A path argument points outside the workspace (an agent error and a safety violation)."""


def resolve_in_workspace(workspace: Path, path: str) -> Path:
    """The real path of `path` inside `workspace`, or OutsideWorkspaceError.

    `path` may be relative, or absolute under /workspace (how the sandbox sees it). Symlinks are
    resolved first, so a link inside the workspace that points outside is refused.
    """
    if not isinstance(path, str) or "\x00" in path:
        raise OutsideWorkspaceError(f"invalid path {path!r}")
    root = workspace.resolve()
    if path == WORKSPACE_MOUNT or path.startswith(WORKSPACE_MOUNT + "/"):
        path = path[len(WORKSPACE_MOUNT):].lstrip("/") or "."
    if os.path.isabs(path):
        raise OutsideWorkspaceError(f"absolute path {path!r} is outside the workspace")
    resolved = (root / path).resolve()
    if resolved != root and root not in resolved.parents:
        raise OutsideWorkspaceError(f"path {path!r} resolves outside the workspace")
    return resolved


def read_file(workspace: Path, path: str, max_bytes: int) -> str:
    target = resolve_in_workspace(workspace, path)
    if not target.is_file():
        raise FileNotFoundError(f"no such file: {path}")
    with open(target, "rb") as f:
        data = f.read(max_bytes + 1)
    text = data[:max_bytes].decode("utf-8", errors="replace")
    return text + ("\n[truncated]" if len(data) > max_bytes else "")


def write_file(workspace: Path, path: str, content: str, max_bytes: int, owner_uid: int | None) -> str:
    target = resolve_in_workspace(workspace, path)
    data = content.encode("utf-8")
    if len(data) > max_bytes:
        raise ValueError(f"content is {len(data)} bytes, over the {max_bytes}-byte file limit")
    target.parent.mkdir(parents=True, exist_ok=True)
    # O_NOFOLLOW: never write through a link, even one created as the final component.
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    if owner_uid is not None and os.geteuid() == 0:
        root = workspace.resolve()
        for p in [target, *target.parents]:
            if p == root:
                break
            os.chown(p, owner_uid, owner_uid)
    return f"wrote {len(data)} bytes to {target.relative_to(workspace.resolve())}"


def list_files(workspace: Path, path: str = ".", max_entries: int = 500) -> str:
    target = resolve_in_workspace(workspace, path or ".")
    if not target.is_dir():
        raise FileNotFoundError(f"no such directory: {path}")
    root = workspace.resolve()
    entries = []
    for dirpath, dirnames, filenames in os.walk(target):
        dirnames.sort()
        for name in sorted(filenames):
            entries.append(str((Path(dirpath) / name).relative_to(root)))
            if len(entries) >= max_entries:
                return "\n".join(entries) + "\n[truncated]"
    return "\n".join(entries)
