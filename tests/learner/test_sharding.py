"""Mesh specs and logical-axis resolution.

Proves: `parse_mesh_spec` fills defaults and one -1 axis and names spec, rule and value in
its errors; parameters resolve through the one rule table (FSDP on `embed`, tensor on
heads/mlp/vocab), with indivisible dimensions left replicated.
Run: `.venv/bin/python -m pytest tests/learner/test_sharding.py -q` (8 fake CPU devices,
set by conftest.py)
"""

import jax
import pytest
from jax.sharding import PartitionSpec as P

from tests.learner.helpers import need_devices, tiny_model_config
from learner import sharding as sh
from model import decoder


def test_parse_mesh_spec():
    assert sh.parse_mesh_spec("data=2,fsdp=4,tensor=1", 8) == {"data": 2, "fsdp": 4, "tensor": 1}
    assert sh.parse_mesh_spec("tensor=2,fsdp=-1", 8) == {"data": 1, "fsdp": 4, "tensor": 2}
    assert sh.parse_mesh_spec("", 8) == {"data": 1, "fsdp": 8, "tensor": 1}
    assert sh.parse_mesh_spec(None, 4) == {"data": 1, "fsdp": 4, "tensor": 1}


@pytest.mark.parametrize("spec, message", [
    ("data=2,fsdp=2", r"mesh spec 'data=2,fsdp=2': axis sizes multiply to 4, but there are 8"),
    ("pipe=8", r"axis must be one of \('data', 'fsdp', 'tensor'\), got 'pipe'"),
    ("data=-1,fsdp=-1", r"at most one axis may be -1"),
    ("data=3,fsdp=-1", r"8 devices do not divide by the fixed axes' product 3"),
    ("fsdp=x", r"size of 'fsdp' must be an int or -1, got 'x'"),
    ("fsdp", r"each entry must be axis=size, got 'fsdp'"),
    ("fsdp=0", r"size of 'fsdp' must be positive or -1, got 0"),
])
def test_parse_mesh_spec_errors(spec, message):
    with pytest.raises(ValueError, match=message):
        sh.parse_mesh_spec(spec, 8)


@need_devices(8)
def test_param_shardings_follow_the_table():
    mesh = sh.make_mesh("fsdp=2,tensor=4")
    config = tiny_model_config(num_kv_heads=2)  # kv heads 2 do not divide by tensor=4
    axes = decoder.param_logical_axes(config)
    shapes = jax.eval_shape(lambda: decoder.init_params(config, jax.random.PRNGKey(0)))
    shardings = sh.param_shardings(mesh, axes, shapes)
    assert shardings["embed"]["embedding"].spec == P("tensor", "fsdp")  # [v, d]
    assert shardings["layers"]["attn"]["q_kernel"].spec == P(None, "fsdp", "tensor")
    assert shardings["layers"]["attn"]["k_kernel"].spec == P(None, "fsdp")  # 2 % 4: replicated
    assert shardings["layers"]["mlp"]["down_kernel"].spec == P(None, "tensor", "fsdp")
    assert shardings["final_norm"]["scale"].spec == P("fsdp")
    assert sh.data_parallel_size(mesh) == 2
    assert sh.describe(mesh) == "data=1,fsdp=2,tensor=4"


def test_activation_rules_split_batch_over_data_and_fsdp():
    rules = dict(sh.ACTIVATION_RULES)
    assert rules["batch"] == ("data", "fsdp") and rules["embed"] is None
    assert dict(sh.PARAM_RULES)["embed"] == "fsdp"
