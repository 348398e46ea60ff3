"""Generate the Python protobuf and gRPC code in `orrery/v1/` from `proto/orrery/v1/*.proto`.

Run after editing a .proto: `python scripts/gen_proto.py`. The generated files are committed;
`tests/proto/test_generated.py` fails when they drift from the sources.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROTO_ROOT = ROOT / "proto"


def generate(out_dir: pathlib.Path) -> list[pathlib.Path]:
    """Compile every .proto under proto/ into out_dir; returns the generated files."""
    import grpc_tools
    from grpc_tools import protoc

    sources = sorted(str(p.relative_to(PROTO_ROOT)) for p in PROTO_ROOT.rglob("*.proto"))
    include = pathlib.Path(grpc_tools.__file__).parent / "_proto"
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = [
        "protoc",
        f"-I{PROTO_ROOT}",
        f"-I{include}",
        f"--python_out={out_dir}",
        f"--pyi_out={out_dir}",
        f"--grpc_python_out={out_dir}",
        *sources,
    ]
    if protoc.main(argv) != 0:
        raise RuntimeError(f"protoc failed on {sources}")
    return sorted(p for p in (out_dir / "orrery").rglob("*_pb2*") if p.suffix in (".py", ".pyi"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=pathlib.Path, default=ROOT, help="folder that receives orrery/v1/")
    args = parser.parse_args()
    for path in generate(args.out):
        print(path.relative_to(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
