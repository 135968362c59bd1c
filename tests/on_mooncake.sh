#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# on_mooncake.sh ENCACHE_TESTS ENCACHE_TOOL: with a real Mooncake Store
# (ENCACHE_TEST_MOONCAKE=1, ENCACHE_MOONCAKE_LIBRARY naming its
# libmooncake_store.so, or the Python package's C ABI over Mooncake's
# Python client with ENCACHE_MOONCAKE_PYTHON naming the Python that has it,
# MOONCAKE_CONFIG_PATH its client JSON, and a running mooncake_master and
# RAM-owning mooncake_client), runs the Store conformance suite, the
# engine's acceptance cases, the lookup threads and a small demo on it
# (tests/mooncake_real.sh starts one from Mooncake's wheel).
# Exits 77 (skipped), saying so, otherwise.  docs/stores.md says how to run
# a Mooncake Store for it.
set -u
tests=$1
tool=$2
if [ "${ENCACHE_TEST_MOONCAKE:-0}" != 1 ]; then
  echo "skipped: set ENCACHE_TEST_MOONCAKE=1 (with ENCACHE_MOONCAKE_LIBRARY and MOONCAKE_CONFIG_PATH) to test on a real Mooncake Store"
  exit 77
fi
: "${MOONCAKE_CONFIG_PATH:?MOONCAKE_CONFIG_PATH must name the client JSON}"
# The client's address is derived as vLLM derives it, not read from the
# JSON; on loopback (inside unshare -n) say it.
export MOONCAKE_REQUESTER_LOCAL_HOSTNAME=${MOONCAKE_REQUESTER_LOCAL_HOSTNAME:-127.0.0.1}
rc=0
# The lookup threads' tests, but the race of a first fd and a first start:
# its 300 rounds each open and close a client (about a second on
# Mooncake: its client's close), and it tests the engine's threads, which
# the shm, Redis and tier runs test.
async="lookup_async_fd lookup_async_handle lookup_async_many
  lookup_async_process lookup_async_reads lookup_async_refuses
  lookup_async_results lookup_async_step lookup_async_stopped
  lookup_async_unconfirmed lookup_async_waits"
# shellcheck disable=SC2086
ENCACHE_TEST_STORE=mooncake: "$tests" store_ engine_ $async || rc=1
out=$("$tool" --store mooncake: demo --encoders 2 --requests 30 --images 12 \
  --tokens 16 --hidden 128 --verify all --no-baseline 2>&1)
if [ $? -eq 0 ] && printf '%s' "$out" | grep -q "verification *passed"; then
  echo "ok - demo on mooncake:"
else
  echo "not ok - demo on mooncake:"; printf '%s\n' "$out"; rc=1
fi
exit $rc
