#!/bin/sh
# Offline stand-in: Orrery's Bazel build does not support `bazel coverage` (use pytest-cov).
echo "remote_coverage_tools is an offline stand-in; bazel coverage is not supported here" >&2
exit 1
