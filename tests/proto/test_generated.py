"""The committed generated code in `orrery/v1/` is exactly what `proto/` compiles to.

Run: `.venv/bin/python -m pytest tests/proto -q`. If this fails, run `python scripts/gen_proto.py`.
"""

import pathlib
import sys

ROOT = pathlib.Path(__file__).absolute().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import gen_proto  # noqa: E402


def test_generated_code_matches_proto_sources(tmp_path):
    generated = gen_proto.generate(tmp_path)
    assert generated, "protoc produced nothing"
    fresh = {p.relative_to(tmp_path): p.read_bytes() for p in generated}
    committed = {
        p.relative_to(ROOT): p.read_bytes()
        for p in (ROOT / "orrery").rglob("*_pb2*")
        if p.suffix in (".py", ".pyi")
    }
    assert sorted(map(str, fresh)) == sorted(map(str, committed))
    stale = [str(path) for path, content in fresh.items() if committed[path] != content]
    assert not stale, f"generated code is stale, run scripts/gen_proto.py: {stale}"


def test_every_proto_declares_the_versioned_package():
    for path in (ROOT / "proto").rglob("*.proto"):
        assert "package orrery.v1;" in path.read_text(), path
