"""Tool-call parsing: the one format a policy turn may call a tool in (Qwen / Hermes style).

The format, exactly:

    ...free text...<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>

- one `<tool_call>` ... `</tool_call>` block per turn; whitespace around the JSON is allowed,
  text before the block is the model's reasoning, text after it is ignored;
- inside, one JSON object with a string "name" and an object "arguments" (optional, default
  {}); "arguments" given as a JSON string holding an object is accepted too, as some models
  emit it; any other key is an error;
- `<tool_call>` and `</tool_call>` are single special tokens of our tokenizer; the parser works
  on the decoded text of the turn and never re-encodes it.

`parse_tool_call(text, tool_names)` returns a `ToolCall`, a parse error (a `str` the agent
shows the model as the observation), or None when the turn holds no `<tool_call>` at all.
"""

from __future__ import annotations

import json
from typing import Any, Collection

from sandbox.api import ToolCall

OPEN, CLOSE = "<tool_call>", "</tool_call>"
CALL_FORMAT = OPEN + '{"name": "...", "arguments": {...}}' + CLOSE


def parse_tool_call(text: str, tool_names: Collection[str] | None = None) -> ToolCall | str | None:
    """Parse the turn's single tool call; see the module docstring for the format."""
    start = text.find(OPEN)
    if start < 0:
        if CLOSE in text:
            return f"found {CLOSE} without {OPEN}; use {CALL_FORMAT}"
        return None
    body_start = start + len(OPEN)
    end = text.find(CLOSE, body_start)
    if end < 0:
        return f"unterminated {OPEN}: close the call with {CLOSE}"
    if OPEN in text[end:] or OPEN in text[body_start:end]:
        return "more than one tool call in one reply; call one tool per reply"
    body = text[body_start:end].strip()
    if not body:
        return f"empty tool call; use {CALL_FORMAT}"
    try:
        value = json.loads(body)
    except json.JSONDecodeError as e:
        return f"tool call is not valid JSON ({e.msg} at char {e.pos}); use {CALL_FORMAT}"
    return _call_from_json(value, tool_names)


def _call_from_json(value: Any, tool_names: Collection[str] | None) -> ToolCall | str:
    if not isinstance(value, dict):
        return f"tool call must be a JSON object, got {type(value).__name__}; use {CALL_FORMAT}"
    extra = sorted(set(value) - {"name", "arguments"})
    if extra:
        return f"tool call has unknown keys {extra}; only 'name' and 'arguments' are allowed"
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return f"tool call 'name' must be a non-empty string, got {name!r}"
    if tool_names is not None and name not in tool_names:
        return f"unknown tool {name!r}; available: {sorted(tool_names)}"
    arguments = value.get("arguments", {})
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return "tool call 'arguments' must be a JSON object, got a string that is not JSON"
    if not isinstance(arguments, dict):
        return f"tool call 'arguments' must be a JSON object, got {type(arguments).__name__}"
    return ToolCall(name=name, arguments=arguments)
