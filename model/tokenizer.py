"""Tokenizer: a `tokenizers.Tokenizer` with our special tokens and the ChatML chat template.

What it is: loads `tokenizer.json` (+ `tokenizer_config.json` when present) from a model
folder, exposes encode / decode, the special-token ids and `apply_chat_template`, which
renders messages in Python as

    <|im_start|>{role}\\n{content}<|im_end|>\\n ...   [+ <|im_start|>assistant\\n]

and encodes the whole rendered string at once — the same string, and so the same ids, as
HF `apply_chat_template(..., tokenize=True)` with the jinja template that
`model.factory` writes (CHATML_TEMPLATE below).

What it is not: a jinja engine. A folder whose chat template is not ChatML still loads,
but `apply_chat_template` always renders ChatML (logged once at load).

Invariants:
- every name in SPECIAL_TOKENS is present as one token id (checked at load);
- `encode` never adds BOS/EOS; special-token strings inside text become their single ids
  (HF default). Rule 1 of the design (token in, token out) means callers keep the ids the
  engine produced rather than re-encoding decoded text.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import tokenizers

logger = logging.getLogger(__name__)

IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END, "<tool_call>", "</tool_call>",
                  "<tool_response>", "</tool_response>")

# HF jinja equivalent of `render_chat`, written into tokenizer_config.json by the factory.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def render_chat(messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
    """Render {role, content} messages as ChatML text (see module docstring)."""
    parts = []
    for i, message in enumerate(messages):
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not role or "\n" in role or "<|" in role:
            raise ValueError(f"messages[{i}]['role'] must be a non-empty str without newlines "
                             f"or special tokens, got {role!r}")
        if not isinstance(content, str):
            raise ValueError(f"messages[{i}]['content'] must be a str, got {content!r}")
        parts.append(f"{IM_START}{role}\n{content}{IM_END}\n")
    if add_generation_prompt:
        parts.append(f"{IM_START}assistant\n")
    return "".join(parts)


def _token_content(value: Any) -> str | None:
    """tokenizer_config.json stores special tokens as a str or as {'content': str, ...}."""
    if isinstance(value, Mapping):
        return value.get("content")
    return value


class Tokenizer:
    """Encode / decode / chat template over a loaded `tokenizers.Tokenizer`."""

    def __init__(self, backend: tokenizers.Tokenizer, *, eos_token: str = IM_END,
                 pad_token: str = END_OF_TEXT, bos_token: str | None = None,
                 chat_template: str | None = None) -> None:
        self.backend = backend
        self.special_token_ids: dict[str, int] = {}
        for token in SPECIAL_TOKENS:
            token_id = backend.token_to_id(token)
            if token_id is None:
                raise ValueError(f"tokenizer special token {token!r} must be in the vocabulary "
                                 f"as one token, got no id")
            self.special_token_ids[token] = token_id
        for field, token in (("eos_token", eos_token), ("pad_token", pad_token),
                             ("bos_token", bos_token)):
            if token is not None and backend.token_to_id(token) is None:
                raise ValueError(f"tokenizer {field} must be in the vocabulary, got {token!r}")
        self.eos_token, self.pad_token, self.bos_token = eos_token, pad_token, bos_token
        self.eos_id: int = backend.token_to_id(eos_token)
        self.pad_id: int = backend.token_to_id(pad_token)
        self.bos_id: int | None = None if bos_token is None else backend.token_to_id(bos_token)
        self.chat_template = chat_template
        if chat_template is not None and chat_template != CHATML_TEMPLATE:
            logger.info("tokenizer chat_template differs from ChatML; apply_chat_template "
                        "renders ChatML regardless")

    @classmethod
    def from_dir(cls, folder: str | Path) -> Tokenizer:
        """Load `folder/tokenizer.json` and, if present, `folder/tokenizer_config.json`."""
        folder = Path(folder)
        path = folder / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"tokenizer folder must contain tokenizer.json, "
                                    f"got none in {folder}")
        backend = tokenizers.Tokenizer.from_file(str(path))
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        return cls(
            backend,
            eos_token=_token_content(config.get("eos_token")) or IM_END,
            pad_token=_token_content(config.get("pad_token")) or END_OF_TEXT,
            bos_token=_token_content(config.get("bos_token")),
            chat_template=config.get("chat_template"),
        )

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included (the model's vocab_size must be >= this)."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids that end a policy turn: eos, <|im_end|> and <|endoftext|>."""
        return frozenset({self.eos_id, self.special_token_ids[IM_END],
                          self.special_token_ids[END_OF_TEXT]})

    def token_id(self, token: str) -> int:
        token_id = self.backend.token_to_id(token)
        if token_id is None:
            raise ValueError(f"tokenizer token must be in the vocabulary, got {token!r}")
        return token_id

    def encode(self, text: str) -> list[int]:
        """Ids of `text`; no BOS/EOS added; special-token strings map to their single ids."""
        return self.backend.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Iterable[str]) -> list[list[int]]:
        return [e.ids for e in self.backend.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: Sequence[Mapping[str, str]],
                            add_generation_prompt: bool = True) -> list[int]:
        """Ids of the ChatML rendering of `messages` (see `render_chat`)."""
        return self.encode(render_chat(messages, add_generation_prompt))
