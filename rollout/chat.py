"""The token layout of an agent episode: the first prompt, and what is inserted after each call.

An episode's token stream, ChatML (the tokenizer's template, `model.tokenizer.render_chat`):

    <|im_start|>system\\n{system prompt + tool list}<|im_end|>\\n        } prompt_ids
    <|im_start|>user\\n{task prompt}<|im_end|>\\n<|im_start|>assistant\\n  }
    {policy turn: the engine's tokens, ending at </tool_call>, <|im_end|> or the token budget}
    {observation_tokens(...)}                                            (loss-masked)
    {policy turn} ...

`observation_tokens` is the ONE place inserted tokens are made. It closes the assistant
message if the policy turn did not (a turn stops at `</tool_call>`, so usually it did not), wraps
the observation in `<tool_response>` inside a user message, and opens the next assistant
message. Special-token strings inside an observation (a tool printing "<|im_end|>") are broken
up with a space so a tool can never forge chat structure. The ids are encoded here once and
stored in the trajectory as they are; nothing is re-tokenised later (DESIGN.md rule 1). The loss
mask is made from the turn roles by `rollout.api.token_stream`.
"""

from __future__ import annotations

import json
from typing import Sequence

from model.tokenizer import IM_END, IM_START, SPECIAL_TOKENS, Tokenizer
from rollout.tool_parser import CALL_FORMAT
from sandbox.api import ToolSpec

TOOL_RESPONSE_OPEN, TOOL_RESPONSE_CLOSE = "<tool_response>", "</tool_response>"


def tool_lines(tools: Sequence[ToolSpec], schema: str = "compact") -> list[str]:
    """'compact': `name(arg1, arg2)` per tool (few tokens, for tiny models on CPU);
    'json': the OpenAI function JSON of each tool, one per line."""
    if schema == "json":
        return [json.dumps(t.to_openai(), separators=(",", ":"), sort_keys=True) for t in tools]
    lines = []
    for tool in tools:
        properties = tool.parameters.get("properties", {}) if tool.parameters else {}
        lines.append(f"{tool.name}({', '.join(properties)})")
    return lines


def system_message(system_prompt: str, tools: Sequence[ToolSpec], schema: str = "compact") -> str:
    return "\n".join([system_prompt, *tool_lines(tools, schema), CALL_FORMAT])


def prompt_tokens(tokenizer: Tokenizer, system: str, user: str) -> tuple[int, ...]:
    """The episode's first prompt: system + user message, then the open assistant message."""
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    return tuple(tokenizer.apply_chat_template(messages, add_generation_prompt=True))


def neutralize(text: str) -> str:
    """Break up special-token strings so tool output cannot forge chat structure."""
    for token in SPECIAL_TOKENS:
        text = text.replace(token, token[0] + " " + token[1:])
    return text


def observation_tokens(tokenizer: Tokenizer, observation: str,
                       policy_turn: Sequence[int]) -> tuple[int, ...]:
    """THE inserted tokens between a policy turn and the next (see the module docstring)."""
    closed = bool(policy_turn) and policy_turn[-1] == tokenizer.special_token_ids[IM_END]
    text = (("" if closed else IM_END) + f"\n{IM_START}user\n{TOOL_RESPONSE_OPEN}"
            + neutralize(observation) + f"{TOOL_RESPONSE_CLOSE}{IM_END}\n{IM_START}assistant\n")
    return tuple(tokenizer.encode(text))


def turn_stop_ids(tokenizer: Tokenizer) -> tuple[int, ...]:
    """A policy turn ends at <|im_end|>, <|endoftext|>, eos, or right after </tool_call>."""
    return tuple(sorted(tokenizer.stop_ids | {tokenizer.special_token_ids["</tool_call>"]}))
