"""Parity with the reference: our decoder vs `transformers` on folders written by save_hf.

Proves: for a tiny Llama (untied, GQA, llama3 rope scaling) and tiny Qwen2 models (q/k/v
bias; tied and untied embeddings), `transformers.AutoModelForCausalLM.from_pretrained`
loads what `save_hf` wrote as-is, and its float32 logits on a right-padded batch match ours
to relative error < 1e-4 (max abs difference over max abs logit, real tokens only). Also
that the `rope_parameters` config.json layout written by transformers 5 reads back to the
same ModelConfig.

Skipped, with the reason, when torch or transformers is not importable.
Run: .venv/bin/python -m pytest tests/model/test_hf_parity.py -q
"""

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="torch not installed (pip install torch==2.13.0)")
transformers = pytest.importorskip("transformers", reason="transformers not installed")

from model.config import ModelConfig  # noqa: E402
from model.decoder import forward, init_params  # noqa: E402
from model.hf_io import save_hf  # noqa: E402

# head_dim 8, theta 1e4: wavelengths 6.3, 63, 628, 6283 against the band [64/4, 64], so
# the llama3 rule leaves one frequency alone, smooths one and divides two by the factor.
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 64}

CASES = {
    "llama_untied_gqa_llama3_rope": dict(arch="llama", num_heads=4, num_kv_heads=2,
                                         rope_scaling=LLAMA3, tie_embeddings=False),
    "qwen2_bias_tied": dict(arch="qwen2", qkv_bias=True, num_heads=4, num_kv_heads=1,
                            tie_embeddings=True, rope_theta=1e6),
    "qwen2_bias_untied_linear_rope": dict(arch="qwen2", qkv_bias=True, num_heads=4,
                                          num_kv_heads=2, tie_embeddings=False,
                                          rope_scaling={"rope_type": "linear", "factor": 2.0}),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers(make_config, random_params, tmp_path, case):
    config = make_config(**CASES[case])
    params = random_params(jax.eval_shape(lambda: init_params(config, jax.random.key(0))),
                           seed=1)
    save_hf(tmp_path, config, params)
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), dtype=torch.float32).eval()

    rng = np.random.default_rng(0)
    tokens = rng.integers(0, config.vocab_size, size=(3, 12))
    mask = np.ones_like(tokens)
    mask[1, 9:] = 0  # right padding
    mask[2, 5:] = 0
    ours = np.asarray(forward(params, config, tokens, attention_mask_bt=mask))
    with torch.no_grad():
        theirs = reference(input_ids=torch.tensor(tokens),
                           attention_mask=torch.tensor(mask)).logits.numpy()
    real = mask.astype(bool)
    error = np.abs(ours[real] - theirs[real]).max() / np.abs(theirs[real]).max()
    print(f"{case}: relative error {error:.2e}")
    assert error < 1e-4, f"{case}: relative error {error:.2e}"


def test_rope_parameters_layout_from_transformers(make_config):
    config = make_config(rope_scaling=LLAMA3, rope_theta=500000.0)
    hf_config = transformers.AutoConfig.for_model(**config.to_hf())
    written = hf_config.to_dict()
    if "rope_parameters" not in written:
        pytest.skip("this transformers version still writes rope_theta + rope_scaling")
    assert "rope_scaling" not in written or written.get("rope_scaling") is None
    assert ModelConfig.from_hf(written) == config
