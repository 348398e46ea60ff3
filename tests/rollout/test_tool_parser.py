"""tool_parser: the one documented tool-call format, and each way a call can be malformed.

Run: .venv/bin/python -m pytest tests/rollout/test_tool_parser.py -q
"""

import pytest

from rollout.tool_parser import parse_tool_call
from sandbox.api import ToolCall

TOOLS = ("calculator", "answer")


def test_well_formed_calls():
    text = 'I will compute.<tool_call>\n{"name": "calculator", "arguments": {"expression": "2+3"}}\n</tool_call><|im_end|>'
    assert parse_tool_call(text, TOOLS) == ToolCall("calculator", {"expression": "2+3"})
    assert parse_tool_call('<tool_call>{"name": "answer"}</tool_call>', TOOLS) == ToolCall("answer", {})
    stringified = '<tool_call>{"name": "answer", "arguments": "{\\"answer\\": \\"5\\"}"}</tool_call>'
    assert parse_tool_call(stringified, TOOLS) == ToolCall("answer", {"answer": "5"})


def test_no_call_is_none():
    assert parse_tool_call("The answer is 5.<|im_end|>", TOOLS) is None


@pytest.mark.parametrize("text, error", [
    ('<tool_call>{"name": "calculator"', "unterminated"),
    ('{"name": "x"}</tool_call>', "without <tool_call>"),
    ("<tool_call>  </tool_call>", "empty tool call"),
    ("<tool_call>{name: calculator}</tool_call>", "not valid JSON"),
    ('<tool_call>["calculator"]</tool_call>', "must be a JSON object, got list"),
    ('<tool_call>{"arguments": {}}</tool_call>', "'name' must be a non-empty string"),
    ('<tool_call>{"name": 3}</tool_call>', "'name' must be a non-empty string"),
    ('<tool_call>{"name": "rm", "arguments": {}}</tool_call>', "unknown tool 'rm'"),
    ('<tool_call>{"name": "answer", "arguments": [1]}</tool_call>', "'arguments' must be a JSON object"),
    ('<tool_call>{"name": "answer", "arguments": "5"}</tool_call>', "'arguments' must be a JSON object"),
    ('<tool_call>{"name": "answer", "args": {}}</tool_call>', "unknown keys ['args']"),
    ('<tool_call>{"name": "answer"}</tool_call><tool_call>{"name": "answer"}</tool_call>', "more than one"),
    ('<tool_call>{"name": "answer"<tool_call>}</tool_call>', "more than one"),
])
def test_malformed_calls_give_errors(text, error):
    result = parse_tool_call(text, TOOLS)
    assert isinstance(result, str) and error in result, result
