"""Bazel test: the protobuf code generated from proto/ equals the committed orrery/ copy.

    same_files.py --prefix gen/ --generated GEN... --committed COMMITTED...

Each generated file `<prefix><path>` must have a committed twin `<path>` with the same bytes,
and every committed generated file must be generated (no stale leftovers). Paths are relative
to the runfiles workspace root. On a mismatch: run `python scripts/gen_proto.py` and commit.
"""

from __future__ import annotations

import argparse
import difflib
import os
import pathlib
import sys


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--generated", nargs="+", required=True)
    parser.add_argument("--committed", nargs="*", default=[])
    args = parser.parse_args(argv)

    srcdir, workspace = os.environ.get("TEST_SRCDIR"), os.environ.get("TEST_WORKSPACE")
    root = pathlib.Path(srcdir) / workspace if srcdir and workspace else pathlib.Path.cwd()

    problems: list[str] = []
    expected: set[str] = set()
    for gen in args.generated:
        if not gen.startswith(args.prefix):
            problems.append(f"{gen}: not under {args.prefix}")
            continue
        rel = gen[len(args.prefix):]
        expected.add(rel)
        committed = root / rel
        if not committed.is_file():
            problems.append(f"{rel}: generated from proto/ but not committed")
            continue
        new, old = (root / gen).read_text(), committed.read_text()
        if new != old:
            diff = "".join(list(difflib.unified_diff(
                old.splitlines(keepends=True), new.splitlines(keepends=True),
                fromfile=f"committed/{rel}", tofile=f"generated/{rel}"))[:40])
            problems.append(f"{rel}: differs from what proto/ generates\n{diff}")
    for rel in sorted(set(args.committed) - expected):
        problems.append(f"{rel}: committed but no longer generated from proto/")

    if problems:
        print("\n".join(problems))
        print(f"\n{len(problems)} problem(s): run `python scripts/gen_proto.py` and commit orrery/.")
        return 1
    print(f"{len(expected)} generated files equal the committed copies")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
