"""Factory: train a byte-level BPE tokenizer and write small HF-style model folders.

What it is: the way tests, examples and the CPU config get a real (randomly initialised)
model without downloading one. `make_tiny_model` writes a folder that `model.hf_io.load_hf`,
`model.tokenizer.Tokenizer.from_dir` and `transformers` all read:

    config.json  model.safetensors  tokenizer.json  tokenizer_config.json

CLI: `python -m model.factory --out DIR --size tiny|small|medium [--arch llama|qwen2]`.

What it is not: pre-training. Weights are the decoder's random init; the tokenizer is
trained on a small corpus (the built-in synthetic one unless given).

Invariants: the same arguments (corpus, sizes, seed) produce byte-identical files; the
model's vocab_size equals the tokenizer's (added tokens included); every token in
`model.tokenizer.SPECIAL_TOKENS` is a single special token.
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import tokenizers
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from model.tokenizer import CHATML_TEMPLATE, END_OF_TEXT, IM_END, SPECIAL_TOKENS, Tokenizer

logger = logging.getLogger(__name__)

# One dial per size; the rest of ModelConfig follows from make_tiny_model's defaults.
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(vocab_size=512, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2),
    "small": dict(vocab_size=2048, hidden_size=256, num_layers=4, num_heads=8, num_kv_heads=4),
    "medium": dict(vocab_size=8192, hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4),
}
_MIN_VOCAB = 256 + len(SPECIAL_TOKENS)  # byte alphabet + special tokens


def builtin_corpus(num_lines: int = 2000, seed: int = 0) -> list[str]:
    """Deterministic synthetic text: arithmetic, short sentences, ChatML and tool calls."""
    rng = random.Random(seed)
    words = ("the model reads a task and calls a tool to compute the answer then it checks "
             "the result with python code and writes the final number for the user").split()
    lines = []
    for i in range(num_lines):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        kind = i % 4
        if kind == 0:
            lines.append(f"What is {a} + {b}? The answer is {a + b}.")
        elif kind == 1:
            lines.append(" ".join(rng.choice(words) for _ in range(rng.randint(5, 15))) + ".")
        elif kind == 2:
            call = json.dumps({"name": "python", "arguments": {"code": f"print({a}*{b})"}})
            lines.append(f"<|im_start|>assistant\n<tool_call>\n{call}\n</tool_call><|im_end|>\n"
                         f"<|im_start|>user\n<tool_response>\n{a * b}\n</tool_response>"
                         f"<|im_end|>\n")
        else:
            lines.append(f"<|im_start|>user\nCompute {a} - {b}.<|im_end|>\n"
                         f"<|im_start|>assistant\n{a - b}<|im_end|>\n")
    return lines


def train_tokenizer(corpus: Iterable[str], vocab_size: int, out_dir: str | Path) -> Path:
    """Train a byte-level BPE (digits split singly) on `corpus`; write tokenizer.json + tokenizer_config.json.

    The vocabulary may come out smaller than `vocab_size` on a small corpus."""
    if vocab_size < _MIN_VOCAB:
        raise ValueError(f"train_tokenizer vocab_size must be >= {_MIN_VOCAB} (256 bytes + "
                         f"special tokens), got {vocab_size}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    backend = tokenizers.Tokenizer(models.BPE())
    # Digits are split one by one before the byte-level split (as Llama 3 and Qwen2 do): a number
    # then has the same tokens wherever it appears, so copying a tool's result into an answer
    # is a token-level copy, which tiny models learn quickly.
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False)])
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=2, show_progress=False,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    backend.train_from_iterator(list(corpus), trainer)
    backend.save(str(out_dir / "tokenizer.json"))
    added = {str(backend.token_to_id(t)): {"content": t, "lstrip": False, "normalized": False,
                                           "rstrip": False, "single_word": False,
                                           "special": True} for t in SPECIAL_TOKENS}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": added,
        "additional_special_tokens": [t for t in SPECIAL_TOKENS if t not in (IM_END, END_OF_TEXT)],
        "bos_token": None,
        "eos_token": IM_END,
        "pad_token": END_OF_TEXT,
        "unk_token": None,
        "chat_template": CHATML_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 20,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    logger.info("trained byte-level BPE with %d tokens into %s",
                backend.get_vocab_size(with_added_tokens=True), out_dir)
    return out_dir


def make_tiny_model(out_dir: str | Path, corpus: Iterable[str] | None = None, *,
                    vocab_size: int = 512, hidden_size: int = 64,
                    intermediate_size: int | None = None, num_layers: int = 2,
                    num_heads: int = 4, num_kv_heads: int = 2, head_dim: int | None = None,
                    arch: str = "llama", tie_embeddings: bool | None = None,
                    rope_theta: float = 10000.0, rope_scaling: Mapping[str, Any] | None = None,
                    max_position_embeddings: int = 2048, seed: int = 0) -> Path:
    """Write a randomly initialised HF-style model folder; returns its path.

    `vocab_size` is the tokenizer's training target; the model gets the trained size.
    `intermediate_size` defaults to 8/3 * hidden (rounded up to a multiple of 8);
    `tie_embeddings` defaults to the arch's usual choice (Qwen2 tied, Llama untied)."""
    import jax  # heavy imports only when a model is made

    from model.config import ModelConfig
    from model.decoder import init_params
    from model.hf_io import save_hf

    out_dir = Path(out_dir)
    with tempfile.TemporaryDirectory() as tmp:
        train_tokenizer(builtin_corpus(seed=seed) if corpus is None else corpus, vocab_size,
                        tmp)
        tokenizer = Tokenizer.from_dir(tmp)
        if intermediate_size is None:
            intermediate_size = -(-hidden_size * 8 // 3 // 8) * 8
        config = ModelConfig(
            vocab_size=tokenizer.vocab_size, hidden_size=hidden_size,
            intermediate_size=intermediate_size, num_layers=num_layers, num_heads=num_heads,
            num_kv_heads=num_kv_heads, head_dim=head_dim, rope_theta=rope_theta,
            rope_scaling=rope_scaling,
            tie_embeddings=(arch == "qwen2") if tie_embeddings is None else tie_embeddings,
            max_position_embeddings=max_position_embeddings,
            arch=arch)
        params = init_params(config, jax.random.key(seed))
        save_hf(out_dir, config, params, tokenizer_dir=tmp,
                hf_extra={"eos_token_id": tokenizer.eos_id, "pad_token_id": tokenizer.pad_id})
    return out_dir


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="folder to write")
    parser.add_argument("--size", default="tiny", choices=sorted(SIZES))
    parser.add_argument("--arch", default="llama", choices=("llama", "qwen2"))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--corpus", help="text file, one document per line (default: built-in)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO)
    corpus = None
    if args.corpus:
        corpus = Path(args.corpus).read_text().splitlines()
    path = make_tiny_model(args.out, corpus, arch=args.arch, seed=args.seed, **SIZES[args.size])
    print(path)


if __name__ == "__main__":
    main()
