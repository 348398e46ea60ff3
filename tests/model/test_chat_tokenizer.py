"""model.tokenizer + model.factory: special tokens, the ChatML template, determinism.

Proves: every agent special token is one id; apply_chat_template renders exactly the
ChatML string and its ids equal encoding that string (and, when transformers is installed,
HF's own apply_chat_template on the factory's folder); encode/decode round-trips text;
the factory is byte-for-byte deterministic for a seed; bad messages fail naming the field.

Run: .venv/bin/python -m pytest tests/model/test_chat_tokenizer.py -q
"""

import pytest

from model.factory import builtin_corpus, train_tokenizer
from model.tokenizer import SPECIAL_TOKENS, Tokenizer, render_chat

MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 12 * 3?"},
            {"role": "assistant", "content": '<tool_call>\n{"name": "python"}\n</tool_call>'},
            {"role": "tool", "content": "<tool_response>\n36\n</tool_response>"}]


def test_special_tokens_are_single_ids(tiny_model_dir):
    tokenizer = Tokenizer.from_dir(tiny_model_dir)
    for token in SPECIAL_TOKENS:
        assert tokenizer.encode(token) == [tokenizer.special_token_ids[token]]
    assert len(set(tokenizer.special_token_ids.values())) == len(SPECIAL_TOKENS)
    assert tokenizer.eos_id == tokenizer.token_id("<|im_end|>")
    assert tokenizer.pad_id == tokenizer.token_id("<|endoftext|>")
    assert tokenizer.eos_id in tokenizer.stop_ids


def test_chat_template_renders_chatml(tiny_model_dir):
    tokenizer = Tokenizer.from_dir(tiny_model_dir)
    text = render_chat(MESSAGES[:2])
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n"
                    "<|im_start|>user\nWhat is 12 * 3?<|im_end|>\n<|im_start|>assistant\n")
    ids = tokenizer.apply_chat_template(MESSAGES)
    assert ids == tokenizer.encode(render_chat(MESSAGES))
    assert tokenizer.decode(ids) == render_chat(MESSAGES)
    assert ids[-4:] == tokenizer.encode("<|im_start|>assistant\n")
    no_prompt = tokenizer.apply_chat_template(MESSAGES, add_generation_prompt=False)
    assert tokenizer.decode(no_prompt).endswith("</tool_response><|im_end|>\n")
    text = "héllo wörld 🚀 12+30=42\n\tdone"
    assert tokenizer.decode(tokenizer.encode(text)) == text


def test_chat_template_matches_transformers(tiny_model_dir):
    transformers = pytest.importorskip("transformers", reason="transformers not installed")
    hf = transformers.AutoTokenizer.from_pretrained(str(tiny_model_dir))
    ids = hf.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=True)
    if not isinstance(ids, list):  # newer transformers return a BatchEncoding
        ids = ids["input_ids"]
    assert ids == Tokenizer.from_dir(tiny_model_dir).apply_chat_template(MESSAGES)


def test_bad_message_names_field(tiny_model_dir):
    tokenizer = Tokenizer.from_dir(tiny_model_dir)
    with pytest.raises(ValueError, match=r"messages\[1\]\['content'\] must be a str, got None"):
        tokenizer.apply_chat_template([{"role": "user", "content": "hi"}, {"role": "user"}])
    with pytest.raises(ValueError, match=r"messages\[0\]\['role'\] must be a non-empty str"):
        render_chat([{"role": "user\nsystem", "content": "x"}])


def test_tokenizer_training_is_deterministic(tmp_path):
    corpus = builtin_corpus(num_lines=300)
    a = train_tokenizer(corpus, 300, tmp_path / "a")
    b = train_tokenizer(corpus, 300, tmp_path / "b")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (a / name).read_bytes() == (b / name).read_bytes()
    with pytest.raises(ValueError, match="vocab_size must be >= 263"):
        train_tokenizer(corpus, 100, tmp_path / "c")
