#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# run.sh BUILD_DIR SOURCE_DIR [PYTEST ARGS...]: the vLLM connector's
# contract suite (tests/vllm, docs/vllm.md) with Debian's /usr/bin/python3,
# set up as the Python package's suite is (tests/python/run.sh: the build's
# package, the fault Store, a Redis server of its own); exits 77 (skipped)
# when /usr/bin/python3 cannot import torch or the extension is not built.
ENCACHE_PY_SUITE=tests/vllm exec bash "$(dirname "$0")/../python/run.sh" "$@"
