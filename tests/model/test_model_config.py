"""model.config: validation names field, rule and value; HF config.json reads and writes.

Proves: bad values fail at construction with a message naming the field; head_dim is
derived; configs hash (usable as jit static args) including rope_scaling; HF config.json in
both the classic (`rope_theta` + `rope_scaling`) and new (`rope_parameters`) layouts gives
the same ModelConfig; to_hf -> from_hf round-trips.

Run: .venv/bin/python -m pytest tests/model/test_model_config.py -q
"""

import json

import pytest

from model.config import ModelConfig

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
          "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@pytest.mark.parametrize("overrides, message", [
    ({"hidden_size": 0}, "hidden_size must be a positive int, got 0"),
    ({"num_kv_heads": 3}, "num_heads must be a multiple of num_kv_heads, got num_heads=4, "
                          "num_kv_heads=3"),
    ({"head_dim": 7}, "head_dim must be a positive even int"),
    ({"dtype": "float16"}, r"dtype must be one of \('float32', 'bfloat16'\), got 'float16'"),
    ({"arch": "gpt2"}, r"arch must be one of \('llama', 'qwen2'\), got 'gpt2'"),
    ({"arch": "llama", "qkv_bias": True}, "qkv_bias must be False for arch 'llama'"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 2.0}},
     r"rope_scaling\['rope_type'\] must be one of \('default', 'linear', 'llama3'\), got 'yarn'"),
    ({"rope_scaling": {"rope_type": "linear"}},
     r"rope_scaling\['factor'\] must be a positive number for rope_type 'linear', got None"),
])
def test_validation_names_field_rule_and_value(make_config, overrides, message):
    with pytest.raises(ValueError, match=message):
        make_config(**overrides)


def test_derived_head_dim_and_hashable(make_config):
    config = make_config(rope_scaling=LLAMA3)
    assert config.head_dim == 32 // 4
    assert config.qkv_bias is False and make_config(arch="qwen2").qkv_bias is True
    assert hash(config) == hash(make_config(rope_scaling=dict(LLAMA3)))
    assert config == make_config(head_dim=8, rope_scaling=LLAMA3)
    assert config.rope_scaling == LLAMA3


def test_hf_round_trip_and_both_rope_layouts(make_config, tmp_path):
    config = make_config(rope_scaling=LLAMA3, rope_theta=500000.0, arch="qwen2", qkv_bias=True,
                         tie_embeddings=True)
    hf = config.to_hf(eos_token_id=3)
    assert hf["architectures"] == ["Qwen2ForCausalLM"] and hf["eos_token_id"] == 3
    assert ModelConfig.from_hf(hf) == config
    (tmp_path / "config.json").write_text(json.dumps(hf))
    assert ModelConfig.from_hf_file(tmp_path) == config
    # Newer transformers: rope_theta moves inside rope_parameters.
    new_layout = {k: v for k, v in hf.items() if k not in ("rope_theta", "rope_scaling")}
    new_layout["rope_parameters"] = {"rope_theta": 500000.0, **LLAMA3}
    assert ModelConfig.from_hf(new_layout) == config
    plain = {**new_layout, "rope_parameters": {"rope_type": "default", "rope_theta": 1e6}}
    read = ModelConfig.from_hf(plain)
    assert read.rope_scaling is None and read.rope_theta == 1e6


def test_from_hf_rejects_what_the_decoder_does_not_implement(make_config):
    hf = make_config().to_hf()
    with pytest.raises(ValueError, match="hidden_act must be 'silu', got 'gelu'"):
        ModelConfig.from_hf({**hf, "hidden_act": "gelu"})
    with pytest.raises(ValueError, match="mlp_bias must be false"):
        ModelConfig.from_hf({**hf, "mlp_bias": True})
    with pytest.raises(ValueError, match="model_type must be one of"):
        ModelConfig.from_hf({**hf, "model_type": "mistral"})
