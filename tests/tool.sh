#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# tool.sh ENCACHE SOURCE_DIR: end-to-end checks of the encache tool as a
# user runs it: outputs, messages and exit codes.
set -u
tool=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fails=0
n=0

# check NAME WANT_STATUS NEEDLE -- ARGS...: runs the tool, expects the exit
# status and NEEDLE in its output (stdout and stderr together, runs of
# spaces and tabs squeezed to one space so that alignment does not matter;
# an empty NEEDLE checks the status only).
check() {
  name=$1 want=$2 needle=$3
  shift 4
  n=$((n + 1))
  out=$("$tool" "$@" 2>&1)
  got=$?
  out=$(printf '%s' "$out" | tr '\t' ' ' | tr -s ' ')
  if [ "$got" -ne "$want" ]; then
    echo "not ok $n - $name: exit $got, expected $want"; echo "$out" | sed 's/^/# /'
    fails=$((fails + 1))
  elif [ -n "$needle" ] && ! printf '%s\n' "$out" | grep -qF -- "$needle"; then
    echo "not ok $n - $name: output lacks '$needle'"; echo "$out" | sed 's/^/# /'
    fails=$((fails + 1))
  else
    echo "ok $n - $name"
  fi
}

# exact NAME EXPECTED -- ARGS...: stdout must be exactly EXPECTED.
exact() {
  name=$1 want=$2
  shift 3
  n=$((n + 1))
  out=$("$tool" "$@" 2>"$tmp/err")
  if [ "$out" != "$want" ]; then
    echo "not ok $n - $name"; echo "# got:  $out"; echo "# want: $want"
    sed 's/^/# /' "$tmp/err"
    fails=$((fails + 1))
  else
    echo "ok $n - $name"
  fi
}

# --- key: both normative vectors of docs/format.md
exact "key vector with prefix" \
  "team@cache@embedding@model:shared/model@revision:rev:1@encoder:encoder:default@dtype:torch.float32@protocol:v3@id:image@1" \
  -- key --prefix team@cache --model shared/model --revision rev:1 --dtype float32 --id image@1
exact "key vector without prefix" \
  "embedding@model:shared/model@revision:default@encoder:encoder:default@dtype:torch.float32@protocol:v3@id:image@1" \
  -- key --model shared/model --dtype float32 --id image@1
# --- key fields as vLLM writes them (issue 10): str() of the JSON value
exact "key --config identity null" \
  "embedding@model:None@revision:default@encoder:encoder:default@dtype:torch.float32@protocol:v3@id:x" \
  -- key --model m --dtype float32 --id x --config '{"ec_connector_extra_config": {"embedding_model_identity": null}}'
check "key --config identity null warns" 0 "gives the key field model:None" -- \
  key --model m --dtype float32 --id x --config '{"ec_connector_extra_config": {"embedding_model_identity": null}}'
exact "key --config identity empty, prefix null" \
  "None@embedding@model:@revision:default@encoder:encoder:default@dtype:torch.float32@protocol:v3@id:x" \
  -- key --model m --dtype float32 --id x --config '{"ec_connector_extra_config": {"embedding_model_identity": "", "embedding_cache_prefix": null}}'
# The encoder field as vLLM's compute_hash() makes it, each factor list
# (vectors: tests/vllm_vectors.json, encoder_hash_factors; issue 27).
exact "key --vllm-mm-encoder-tp-mode weights (newest vLLM's default: [None, 'weights', None, None])" \
  "embedding@model:m@revision:default@encoder:dd7a6ff1cee4ccb4a87001c107039398@dtype:torch.float32@protocol:v3@id:x" \
  -- key --model m --dtype float32 --id x --vllm-mm-encoder-tp-mode weights
exact "key --vllm-mm-factors newest alone is vLLM's default" \
  "embedding@model:m@revision:default@encoder:dd7a6ff1cee4ccb4a87001c107039398@dtype:torch.float32@protocol:v3@id:x" \
  -- key --model m --dtype float32 --id x --vllm-mm-factors newest
exact "key --vllm-mm-factors 2 ([None, 'weights'], vLLM 55e847c0)" \
  "embedding@model:m@revision:default@encoder:37a439e484856856b929daf9ace244bc@dtype:torch.float32@protocol:v3@id:x" \
  -- key --model m --dtype float32 --id x --vllm-mm-factors 2
exact "key --vllm-mm-factors 1 ([None], vLLM 01230b40)" \
  "embedding@model:m@revision:default@encoder:8c3b464958e9ad0f20fb2e3b74c80519@dtype:torch.float32@protocol:v3@id:x" \
  -- key --model m --dtype float32 --id x --vllm-mm-factors 1
exact "key fp8 with a scale path ([None, 'weights', 'fp8', '/models/scales.json'])" \
  "embedding@model:m@revision:default@encoder:546f3f4797875ca2b8a4f884803e2738@dtype:torch.float32@protocol:v3@id:x" \
  -- key --model m --dtype float32 --id x --vllm-mm-encoder-attn-dtype fp8 --vllm-mm-encoder-fp8-scale-path /models/scales.json
exact "key backend without tp mode ([FLASH_ATTN, weights, None, None])" \
  "embedding@model:m@revision:default@encoder:9a0ecf7ac31e0cd8c968220bf72366d2@dtype:torch.float32@protocol:v3@id:x" \
  -- key --model m --dtype float32 --id x --vllm-mm-encoder-attn-backend flash_attn
check "key --vllm-mm-factors 3 refused" 2 "--vllm-mm-factors is 1, 2, 4" -- \
  key --model m --dtype float32 --id x --vllm-mm-factors 3
check "key --encoder-hash with --vllm-mm-factors refused" 2 "both set the encoder field" -- \
  key --model m --dtype float32 --id x --encoder-hash abc --vllm-mm-factors 2
exact "key with encoder hash" \
  "embedding@model:m@revision:default@encoder:abc@dtype:torch.bfloat16@protocol:v3@id:x" \
  -- key --model m --encoder-hash abc --dtype bfloat16 --id x
exact "key --namespace" \
  "embedding@model:m@revision:r@encoder:encoder:default@dtype:torch.float16@protocol:v3" \
  -- key --model m --revision r --dtype torch.float16 --namespace
check "key needs --model" 2 "--model is required" -- key --dtype float32 --id x
check "key needs --id" 2 "--id is required" -- key --model m --dtype float32
check "key bad dtype" 2 'unknown dtype "int8"' -- key --model m --dtype int8 --id x
check "key unknown option" 2 "unknown option '--bogus'" -- key --bogus
check "key option without value" 2 "--model needs a value" -- key --model
check "key --help" 0 "usage: encache key" -- key --help

# --- identity: a model directory's weights, as an RL loop rewrites them
mkdir -p "$tmp/model/visual"
printf 'shard one' > "$tmp/model/model-00001.safetensors"
printf 'tower' > "$tmp/model/visual/tower.bin"
printf '{}' > "$tmp/model/config.json"
id1=$("$tool" identity --model-dir "$tmp/model")
case $id1 in
  model@weights:xxh128:????????????????????????????????) echo "ok $((n += 1)) - identity format, default label" ;;
  *) echo "not ok $((n += 1)) - identity format: got '$id1'"; fails=$((fails + 1)) ;;
esac
exact "identity stable" "$id1" -- identity --model-dir "$tmp/model/"
exact "identity --label" "org/m@${id1#model@}" -- identity --model-dir "$tmp/model" --label org/m
printf '{"changed": 1}' > "$tmp/model/config.json"
exact "identity ignores configs" "$id1" -- identity --model-dir "$tmp/model"
printf 'shard One' > "$tmp/model/model-00001.safetensors" # new weights
id2=$("$tool" identity --model-dir "$tmp/model")
n=$((n + 1))
if [ -n "$id2" ] && [ "$id2" != "$id1" ]; then echo "ok $n - identity follows the weights"
else echo "not ok $n - identity follows the weights: '$id1' then '$id2'"; fails=$((fails + 1)); fi
check "identity --json" 0 "{\"identity\": \"$id2\", \"files\": 2, \"bytes\": 14, \"seconds\": " -- identity --model-dir "$tmp/model" --json
check "identity missing directory" 1 "encache identity: $tmp/none: No such file or directory" -- identity --model-dir "$tmp/none"
mkdir "$tmp/nomodel"
check "identity without weights" 1 "encache identity: $tmp/nomodel: no weight files" -- identity --model-dir "$tmp/nomodel"
check "identity needs --model-dir" 2 "--model-dir is required" -- identity
check "identity bad label" 2 "label \"a@b\": character '@'" -- identity --model-dir "$tmp/model" --label a@b
check "identity takes no argument" 2 "unexpected argument" -- identity --model-dir "$tmp/model" x
check "identity --help" 0 "usage: encache identity --model-dir DIR" -- identity --help
# The identity in a key, as embedding_model_identity.
exact "identity as embedding_model_identity" \
  "embedding@model:$id2@revision:default@encoder:encoder:default@dtype:torch.float32@protocol:v3@id:x" \
  -- key --config "{\"ec_connector_extra_config\": {\"embedding_model_identity\": \"$id2\"}}" --dtype float32 --id x

# --- global
check "--help" 0 "Commands:" -- --help
check "--version" 0 "encache 1.3.0" -- --version
check "no command" 2 "usage: encache" --
check "unknown command" 2 "unknown command 'frobnicate'" -- frobnicate
check "unknown global option" 2 "unknown global option '--nope'" -- --nope key
check "help key" 0 "usage: encache key" -- help key

# --- config check
ref='{"ec_connector":"ECMooncakeStorageConnector","ec_role":"ec_producer",
"ec_connector_extra_config":{"cross_encoder_cache":true,
"embedding_cache_prefix":"team@cache","store_max_pending_items":8,"future":1}}'
check "config accepts reference options" 0 "configuration OK" -- config check --ec-transfer-config "$ref"
check "config shows given values" 0 'ec_connector_extra_config.store_max_pending_items = 8' -- config check --ec-transfer-config "$ref"
check "config marks defaults" 0 'ec_connector_extra_config.store_read_buffer_bytes = 134217728 (default)' -- config check --ec-transfer-config "$ref"
check "config reports unknown options" 0 "ec_connector_extra_config.future" -- config check --ec-transfer-config "$ref"
printf '%s' "$ref" > "$tmp/ec.json"
check "config @FILE" 0 "configuration OK" -- config check --ec-transfer-config "@$tmp/ec.json"
check "config @missing" 2 "cannot open $tmp/none.json" -- config check --ec-transfer-config "@$tmp/none.json"
for bad in 0 -1 1.5 '"eight"' '"1.0"' true; do
  check "config refuses pending items $bad" 2 \
    "ec_connector_extra_config.store_max_pending_items: must be a positive integer" \
    -- config check --ec-transfer-config "{\"ec_connector_extra_config\":{\"store_max_pending_items\":$bad}}"
done
# ... and accepts what vLLM's _positive_int accepts (issue 27).
for good in '"8"' 8.0; do
  check "config accepts pending items $good as vLLM does" 0 \
    "ec_connector_extra_config.store_max_pending_items = 8" \
    -- config check --ec-transfer-config "{\"ec_connector_extra_config\":{\"store_max_pending_items\":$good}}"
done
check "config refuses non-boolean" 2 "cross_encoder_cache: must be a boolean" \
  -- config check --ec-transfer-config '{"ec_connector_extra_config":{"cross_encoder_cache":"yes"}}'
printf '{\n  "ec_connector_extra_config": {\n    "cross_encoder_cache": tru\n  }\n}\n' > "$tmp/bad.json"
check "config malformed JSON line and column" 2 "malformed JSON at line 3, column" \
  -- config check --ec-transfer-config "@$tmp/bad.json"
check "config refuses unstable identifiers" 2 "mm_processor_cache_gb" \
  -- config check --ec-transfer-config "$ref" --mm-processor-cache-gb 0
check "config refuses tensor parallel" 2 "tensor_parallel_size: is 2" \
  -- config check --ec-transfer-config "$ref" --tensor-parallel-size 2
check "config needs --ec-transfer-config" 2 "--ec-transfer-config is required" -- config check
check "config check --help" 0 "--mooncake-config FILE" -- config check --help
check "config unknown subcommand" 2 "unknown subcommand 'verify'" -- config verify

cat > "$tmp/mc.json" <<'JSON'
{"local_hostname": "127.0.0.1", "metadata_server": "P2PHANDSHAKE",
 "master_server_address": "127.0.0.1:50051", "protocol": "tcp",
 "mode": "standalone-store", "global_segment_size": 0,
 "local_buffer_size": "512MB"}
JSON
check "config mooncake accepted" 0 "mooncake.local_buffer_size" -- config check --ec-transfer-config "$ref" --mooncake-config "$tmp/mc.json"
check "config mooncake sizes" 0 "= 536870912" -- config check --ec-transfer-config "$ref" --mooncake-config "$tmp/mc.json"
sed 's/"global_segment_size": 0,//' "$tmp/mc.json" > "$tmp/mc2.json"
check "config mooncake standalone needs 0" 2 "mooncake.global_segment_size: mode \"standalone-store\" needs an explicit global_segment_size of 0" \
  -- config check --ec-transfer-config "$ref" --mooncake-config "$tmp/mc2.json"
sed 's/"protocol": "tcp",/"protocol": "tcp", "enable_offload": true,/' "$tmp/mc.json" > "$tmp/mc3.json"
check "config mooncake refuses offload" 2 "mooncake.enable_offload: must not be true" \
  -- config check --ec-transfer-config "$ref" --mooncake-config "$tmp/mc3.json"
n=$((n + 1))
if MOONCAKE_CONFIG_PATH="$tmp/mc2.json" "$tool" config check --ec-transfer-config "$ref" >/dev/null 2>&1; then
  echo "not ok $n - config reads MOONCAKE_CONFIG_PATH"; fails=$((fails + 1))
else
  echo "ok $n - config reads MOONCAKE_CONFIG_PATH"
fi

# --- Store commands, on a private shm segment
seg="encache-tooltest-$$"
export ENCACHE_STORE="shm://$seg?size=4MiB"
trap 'rm -rf "$tmp"; "$tool" shm destroy "$seg" >/dev/null 2>&1' EXIT
printf '\116\117\117\115\000\000\000\000\002\000\000\000\000\000\000\000\002\000\000\000\000\000\000\000\000\000\200\077\000\000\000\100\000\000\100\100\000\000\200\100' > "$tmp/v3.bin"
check "put" 0 "written 40 bytes" -- put "emb@id:1" "$tmp/v3.bin"
check "put never replaces" 1 "exists (objects are never replaced" -- put "emb@id:1" "$tmp/v3.bin"
n=$((n + 1))
if "$tool" get "emb@id:1" | cmp -s - "$tmp/v3.bin"; then echo "ok $n - get is byte-exact"
else echo "not ok $n - get is byte-exact"; fails=$((fails + 1)); fi
check "inspect v3" 0 "object: float32 2x2, 16 payload bytes" -- inspect "emb@id:1"
printf 'hello' > "$tmp/plain"
check "put stdin" 0 "written 5 bytes" -- put other - < "$tmp/plain"
check "inspect non-v3" 0 "not a v3 object: 5 bytes, shorter than the 24-byte header" -- inspect other
check "ls all" 0 "40 emb@id:1" -- ls
check "ls pattern" 0 "5 other" -- ls 'oth*'
n=$((n + 1))
if [ "$("$tool" ls 'emb*' | wc -l)" -eq 1 ]; then echo "ok $n - ls filters"
else echo "not ok $n - ls filters"; fails=$((fails + 1)); fi
check "stats" 0 "objects 2" -- stats
check "--store overrides ENCACHE_STORE" 0 "objects 0" -- --store "shm://$seg-b?size=2MiB&create=yes" stats
check "--store after the command" 0 "objects 0" -- stats --store "shm://$seg-b?size=2MiB"
"$tool" shm destroy "$seg-b" >/dev/null
check "get missing" 1 "nope: not found" -- get nope
check "rm" 0 "" -- rm other
check "rm missing" 1 "other: not found" -- rm other
check "bad store URL" 1 "unknown option 'sise'" -- --store "shm://x?sise=1" stats
check "unknown scheme" 1 "cannot open the Store" -- --store "ftp://x" stats
# --- lookup and publish through the engine
printf '\000\000\200\077\000\000\000\100\000\000\100\100\000\000\200\100' > "$tmp/payload"
ns="embedding@model:m@revision:default@encoder:encoder:default@dtype:torch.float32@protocol:v3"
check "publish writes" 0 "$ns@id:img1 written" -- publish --model m --dtype float32 --rows 2 --cols 2 --id img1 "$tmp/payload"
check "publish never replaces" 0 "skipped: already in the Store" -- publish --model m --dtype float32 --rows 2 --cols 2 --id img1 "$tmp/payload"
n=$((n + 1))
if "$tool" get "$ns@id:img1" | cmp -s - "$tmp/v3.bin"; then echo "ok $n - published object is the normative v3 vector"
else echo "not ok $n - published object is the normative v3 vector"; fails=$((fails + 1)); fi
check "lookup hit" 0 "img1 HIT float32 2 2" -- lookup --model m --dtype float32 --rows 2 --cols 2 img1 img2
check "lookup miss" 0 "img2 MISS" -- lookup --model m --dtype float32 --rows 2 --cols 2 img1 img2
check "lookup incompatible names the shape" 0 "img1 INCOMPATIBLE shape 2x2 (expected 4x1)" -- lookup --model m --dtype float32 --rows 4 --cols 1 img1
check "another model dtype is another namespace" 0 "img1 MISS" -- lookup --model m --dtype float16 --rows 2 --cols 4 img1
check "lookup --json" 0 '"outcome": "HIT"' -- lookup --json --model m --dtype float32 --rows 2 --cols 2 img1
check "lookup via --config identity" 0 "img1 HIT" -- lookup --config '{"ec_connector_extra_config": {"cross_encoder_cache": true, "embedding_model_identity": "m"}}' --dtype float32 --rows 2 --cols 2 img1
# --- namespaces: what is in the Store, and config check's look (issue 27)
check "namespaces counts objects and bytes" 0 "1 40 $ns" -- namespaces
check "namespaces lists a key without @id: on its own" 0 "1 40 emb" -- namespaces
check "namespaces takes no argument" 2 "" -- namespaces extra
cc='{"ec_connector_extra_config": {"cross_encoder_cache": true}}'
check "config check prints the namespace" 0 "namespace: $ns" -- \
  config check --ec-transfer-config "$cc" --model m --dtype float32
check "config check counts its objects in the Store" 0 "objects under this namespace in the Store: 1" -- \
  --store "$ENCACHE_STORE" config check --ec-transfer-config "$cc" --model m --dtype float32
check "config check warns when only other namespaces of the model have objects" 0 \
  "warning: no object under the configured namespace, while 1 other namespace of the same model has some" -- \
  --store "$ENCACHE_STORE" config check --ec-transfer-config "$cc" --model m --dtype float32 --vllm-mm-encoder-tp-mode weights
n=$((n + 1))
if "$tool" --store "$ENCACHE_STORE" config check --ec-transfer-config "$cc" --model m --dtype float32 | grep -q '^warning: no object'; then
  echo "not ok $n - config check does not warn when its namespace has objects"; fails=$((fails + 1))
else echo "ok $n - config check does not warn when its namespace has objects"; fi
check "config check refuses --prefix" 2 "come from --ec-transfer-config" -- \
  config check --ec-transfer-config "$cc" --prefix p --model m --dtype float32
check "lookup --config off" 2 "cross_encoder_cache is false" -- lookup --config '{}' --model m --dtype float32 --rows 2 --cols 2 img1
check "lookup prefix namespace differs" 0 "img1 MISS" -- lookup --prefix team --model m --dtype float32 --rows 2 --cols 2 img1
# --device cuda:N on the fake CUDA runtime (tests/fake_cudart.c), and without one
if [ -n "${ENCACHE_TEST_FAKE_CUDART:-}" ]; then
  export ENCACHE_CUDA_LIBRARY="$ENCACHE_TEST_FAKE_CUDART"
  check "lookup --device cuda:1" 0 "img1 HIT float32 2 2" -- lookup --device cuda:1 --model m --dtype float32 --rows 2 --cols 2 img1 img2
  check "lookup --device cuda:1 miss" 0 "img2 MISS" -- lookup --device cuda:1 --model m --dtype float32 --rows 2 --cols 2 img1 img2
  check "lookup --device beyond the devices" 0 "img1 SKIPPED device_index is not a CUDA device" -- lookup --device cuda:7 --model m --dtype float32 --rows 2 --cols 2 img1
  export ENCACHE_CUDA_LIBRARY=/nonexistent/libcudart.so
  check "lookup --device without a runtime" 0 "img1 SKIPPED CUDA runtime not available: cannot load /nonexistent/libcudart.so" -- lookup --device cuda:0 --model m --dtype float32 --rows 2 --cols 2 img1
  unset ENCACHE_CUDA_LIBRARY
fi
check "lookup --device names the form" 2 "--device: 'gpu0' is neither host nor cuda:N" -- lookup --device gpu0 --model m --dtype float32 --rows 2 --cols 2 img1
check "publish wrong size" 2 "holds 16 bytes, but 2x3 float32 needs 24" -- publish --model m --dtype float32 --rows 2 --cols 3 --id x "$tmp/payload"
check "publish endless file" 2 "holds more than 16 bytes, but 2x2 float32 needs 16" -- publish --model m --dtype float32 --rows 2 --cols 2 --id x /dev/zero
check "publish needs --id" 2 "--id is required" -- publish --model m --dtype float32 --rows 2 --cols 2 "$tmp/payload"
check "lookup needs rows" 2 "--rows and --cols are required" -- lookup --model m --dtype float32 img1
check "lookup bad rows" 2 "--rows: must be a positive integer" -- lookup --model m --dtype float32 --rows 0 --cols 2 img1
check "lookup --help" 0 "INCOMPATIBLE (and what did not match)" -- lookup --help
check "publish --help" 0 "raw row-major payload" -- publish --help
# --- purge: the namespace's objects and nothing else (issue 16)
nsb=$("$tool" key --prefix "$ns" --model m --dtype float32 --namespace)
for k in "$ns@id:img2" "$ns@id:a*[?\\" "$ns" "$ns@idx" "$nsb@id:x" plain-key; do
  "$tool" put "$k" "$tmp/plain" >/dev/null
done
before=$("$tool" ls)
check "purge --dry-run counts" 0 "would remove 3 objects (50 bytes)" -- purge --namespace-of --model m --dtype float32 --dry-run
n=$((n + 1))
if [ "$("$tool" ls)" = "$before" ]; then echo "ok $n - purge --dry-run removes nothing"
else echo "not ok $n - purge --dry-run removes nothing"; fails=$((fails + 1)); fi
check "purge prints the prefix" 0 "prefix: $ns@id:" -- purge --namespace-of --model m --dtype float32 --dry-run
check "purge removes the namespace" 0 "removed 3 objects" -- purge --namespace-of --model m --dtype float32
n=$((n + 1))
if [ "$("$tool" ls "$ns@id:*")" = "" ]; then echo "ok $n - purge left nothing of the namespace"
else echo "not ok $n - purge left nothing of the namespace"; fails=$((fails + 1)); fi
# Everything else survives byte for byte: the bare namespace, @idx, a
# namespace that starts with the purged one, a key of no namespace.
bad=0
for k in "$ns" "$ns@idx" "$nsb@id:x" plain-key; do
  "$tool" get "$k" | cmp -s - "$tmp/plain" || bad=1
done
n=$((n + 1))
if [ $bad -eq 0 ]; then echo "ok $n - purge kept every other object, byte for byte"
else echo "not ok $n - purge kept every other object, byte for byte"; fails=$((fails + 1)); fi
check "purge again removes 0" 0 "removed 0 objects" -- purge --namespace-of --model m --dtype float32
check "purge of an empty namespace" 0 "would remove 0 objects (0 bytes)" -- purge --namespace-of --model never-used --dtype float16 --dry-run
check "purge --config identity" 0 "prefix: embedding@model:m@revision:default" -- purge --namespace-of --config '{"ec_connector_extra_config": {"embedding_model_identity": "m"}}' --dtype float32 --dry-run
check "purge --key-prefix" 0 "removed 3 objects" -- purge --key-prefix "$ns"
check "purge --key-prefix kept the rest" 0 "5 plain-key" -- ls
"$tool" rm plain-key >/dev/null
check "purge needs a selector" 2 "give either --namespace-of" -- purge --model m --dtype float32
check "purge takes one selector" 2 "give either --namespace-of" -- purge --namespace-of --key-prefix x --model m --dtype float32
check "purge --key-prefix not empty" 2 "--key-prefix must not be empty" -- purge --key-prefix ''
check "purge --key-prefix without namespace options" 2 "--model names a namespace" -- purge --key-prefix x --model m
check "purge --namespace-of needs --dtype" 2 "--dtype is required" -- purge --namespace-of --model m
check "purge --namespace-of needs --model" 2 "--model is required" -- purge --namespace-of --dtype float32
check "purge takes no argument" 2 "unexpected argument 'x'" -- purge --key-prefix k x
check "purge --help" 0 'NAMESPACE "@id:"' -- purge --help
# --- --timeout (issue 41): a Redis server whose SCAN cursor never comes
# back to 0 and whose DBSIZE is no count (a bound of some 168 000 SCANs, a
# millisecond each here: minutes) stops ls, namespaces and purge at the
# bound given, with the message of the bound on SCAN calls.
for c in ls namespaces purge; do
  check "$c --help has --timeout" 0 "--timeout SECONDS stop after SECONDS" -- $c --help
done
check "ls --timeout 0" 2 "encache ls: --timeout: must be an integer from 1 to 86400, got \"0\"" -- ls --timeout 0
check "purge --timeout x" 2 "encache purge: --timeout: must be an integer from 1 to 86400" -- purge --key-prefix k --timeout x
check "ls --timeout on shm" 0 "" -- ls --timeout 5
if [ -x /usr/bin/python3 ]; then
  /usr/bin/python3 - "$tmp/scan.port" <<'PY' &
import os, socket, sys, threading, time
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(16)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(srv.getsockname()[1]))
os.rename(sys.argv[1] + ".tmp", sys.argv[1])
def serve(c):
    f = c.makefile("rb")
    try:
        while True:
            line = f.readline()
            if not line.startswith(b"*"):
                return
            args = []
            for _ in range(int(line[1:])):
                n = int(f.readline()[1:])
                args.append(f.read(n + 2)[:n])
            verb = args[0].upper()
            if verb == b"SCAN":  # one key, and a cursor that is never 0
                time.sleep(0.001)
                c.sendall(b"*2\r\n$1\r\n7\r\n*1\r\n$1\r\nk\r\n")
            else:
                c.sendall({b"DBSIZE": b"+lots\r\n", b"UNLINK": b":1\r\n",
                           b"PING": b"+PONG\r\n"}.get(verb, b"+OK\r\n"))
    except (OSError, ValueError):
        pass
    finally:
        c.close()
threading.Timer(120, lambda: os._exit(0)).start()
while True:
    conn, _ = srv.accept()
    threading.Thread(target=serve, args=(conn,), daemon=True).start()
PY
  scan_pid=$!
  for _ in $(seq 100); do [ -s "$tmp/scan.port" ] && break; sleep 0.05; done
  scan="redis://127.0.0.1:$(cat "$tmp/scan.port")"
  for c in ls namespaces "purge --key-prefix k"; do
    t0=$(date +%s)
    # shellcheck disable=SC2086
    check "$c --timeout 1 on a SCAN without end" 1 "SCAN did not finish after" -- --store "$scan" $c --timeout 1
    took=$(($(date +%s) - t0))
    n=$((n + 1))
    if printf '%s' "$out" | grep -qF "in the list timeout of 1000 ms: the server's cursor never comes back to 0" &&
       [ "$took" -le 20 ]; then echo "ok $n - $c --timeout 1 ends by its bound (${took} s)"
    else echo "not ok $n - $c --timeout 1 ends by its bound (${took} s)"; fails=$((fails + 1)); fi
  done
  check "purge stopped by --timeout says what it removed" 1 "objects before the failure" -- --store "$scan" purge --key-prefix k --timeout 1
  kill "$scan_pid" 2>/dev/null
fi
# --- the demo on real PNG files (one of them broken: skipped, named)
check "demo --images DIR" 0 "verification passed" -- demo --encoders 2 --requests 10 --images "$src/tests/data/images" --tokens 16 --hidden 32 --verify all --no-baseline
check "demo names a broken image" 0 "skipping $src/tests/data/images/not-an-image.png" -- demo --encoders 1 --requests 2 --images "$src/tests/data/images" --tokens 4 --hidden 8 --no-baseline
check "demo --json" 0 '"passed": true' -- demo --encoders 2 --requests 10 --images 4 --tokens 4 --hidden 8 --json
# The summary's rows under "encodes avoided" add up to it (issue 27).
n=$((n + 1))
"$tool" demo --encoders 2 --requests 30 --images 6 --tokens 4 --hidden 8 --json --no-baseline > "$tmp/demo.json" 2>/dev/null
if /usr/bin/python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
h = d["hits"]
assert d["encodes_avoided"] == h["published_by_other_encoders"] + h["published_by_same_encoder"] + d["repeats_within_a_request"], d
' "$tmp/demo.json"; then echo "ok $n - demo summary adds up"
else echo "not ok $n - demo summary adds up"; fails=$((fails + 1)); fi
# --overlap (the default) starts every request's lookup ahead; the same
# workload with --no-overlap has the same images, every hit verified.
n=$((n + 1))
"$tool" demo --encoders 2 --requests 25 --images 6 --tokens 4 --hidden 8 --json --no-baseline --verify all > "$tmp/demo-ov.json" 2>/dev/null
"$tool" demo --encoders 2 --requests 25 --images 6 --tokens 4 --hidden 8 --json --no-baseline --verify all --no-overlap > "$tmp/demo-no.json" 2>/dev/null
if /usr/bin/python3 -c 'import json, sys
ov, no = (json.load(open(f)) for f in sys.argv[1:3])
assert ov["lookups"]["started_ahead"] == ov["requests"] == 50, ov["lookups"]
assert no["lookups"]["started_ahead"] == 0, no["lookups"]
assert ov["images"] == no["images"], (ov["images"], no["images"])
assert ov["verification"]["passed"] and no["verification"]["passed"]
# Every hit checked.  (How many hits there are depends on the machine: a
# loaded one may run all 50 requests before the worker writes the first
# publication, and every lookup misses.)
for d in ov, no:
    assert d["verification"]["checked"] == d["hits"]["total"], (
        d["verification"], d["hits"])
' "$tmp/demo-ov.json" "$tmp/demo-no.json"; then echo "ok $n - demo --overlap and --no-overlap serve the same images"
else echo "not ok $n - demo --overlap and --no-overlap serve the same images"; fails=$((fails + 1)); fi
check "demo --overlap and --no-overlap" 2 "give one" -- demo --overlap --no-overlap
check "demo --help has no %%" 0 "host i mod N" -- demo --help
check "demo bad option" 2 "--encoders: must be an integer from 1 to 64" -- demo --encoders 0
check "demo --help says stand-in" 0 "stand-in for a vision tower" -- demo --help
check "bench bad size" 2 "--sizes: \"huge\" is not a size" -- bench --sizes huge
check "bench plot must be svg" 2 "only SVG" -- bench --plot x.png
check "bench honours ENCACHE_STORE" 0 "shm://$seg?size=4MiB" -- bench --sizes 16KiB --iterations 1 --batch 1
check "bench puts the non-blocking lookup beside the blocking one" 0 "lookup start+wait" -- bench --sizes 16KiB --iterations 1 --batch 1
check "bench --json has the overlap figures" 0 "\"step_overlapped_ms\"" -- bench --json --sizes 16KiB --iterations 1 --batch 1
check "shm destroy" 0 "destroyed $seg" -- shm destroy "$seg"
check "shm destroy missing" 1 "no such segment" -- shm destroy "$seg"
check "shm destroy bad name" 2 "is not a segment name" -- shm destroy "../x"
check "put --help" 0 "usage: encache [--store URL] put KEY FILE" -- put --help
check "ls --help" 0 "shell PATTERN" -- ls --help

# --- the shared option parsing: every command has --help, names an unknown
# option and a missing value, and refuses stray arguments
for c in demo key config lookup publish bench put get inspect ls stats rm purge shm; do
  check "$c --help" 0 "usage: encache" -- $c --help
  check "help $c" 0 "usage: encache" -- help $c
  check "$c unknown option" 2 "encache $c: unknown option '--no-such-option'" -- $c --no-such-option
done
for c in demo lookup publish bench put get inspect ls stats rm purge; do
  check "$c --store without a URL" 2 "encache $c: --store needs a value" -- $c --store
done
check "key --store is not an option of key" 2 "unknown option '--store'" -- key --store x
check "--json is not an option of put" 2 "encache put: unknown option '--json'" -- put --json k f
check "demo missing value" 2 "encache demo: --encoders needs a value" -- demo --encoders
check "bench missing value" 2 "encache bench: --sizes needs a value" -- bench --sizes
check "lookup missing value" 2 "encache lookup: --rows needs a value" -- lookup --model m --rows
check "config check missing value" 2 "--ec-transfer-config needs a value" -- config check --ec-transfer-config
check "option=value form" 0 "embedding@model:m@" -- key --model=m --dtype=float32 --id=x
check "get needs KEY" 2 "encache get: expects KEY, got 0 arguments" -- get
check "put needs KEY FILE" 2 "encache put: expects KEY FILE, got 1 argument" -- put k
check "stats takes no argument" 2 "encache stats: unexpected argument 'x'" -- stats x
check "shm needs destroy" 2 "expects 'destroy NAME'" -- shm remove x
check "demo stray argument" 2 "encache demo: unexpected argument 'x'" -- demo x
check "several --store only for bench" 2 "only bench takes several Stores" -- --store shm://a stats --store shm://b
check "bench --iterations range" 2 "--iterations: must be an integer from 1 to 100000" -- bench --iterations 0
check "demo --verify" 2 "--verify: all, sample or none" -- demo --verify most
check "demo --baseline and --no-baseline" 2 "give one" -- demo --baseline --no-baseline
# --- read-only commands never create a segment (issue 18): "no such
# segment", exit 1 as for any Store that cannot be opened
none="$seg-none"
for c in stats ls "get k" "inspect k" "rm k" "purge --key-prefix k" \
  "lookup --model m --dtype float32 --rows 2 --cols 2 img1"; do
  # shellcheck disable=SC2086
  check "$c on a missing segment" 1 "no such segment \"$none\"" -- --store "shm://$none?size=2MiB" $c
done
n=$((n + 1))
if [ -e "/dev/shm/encache-$none" ]; then echo "not ok $n - read-only commands created no segment"; fails=$((fails + 1))
else echo "ok $n - read-only commands created no segment"; fi
# The local segment of a tier: not created either (issue 26, 9b: it was,
# at the tier's full size), whatever the remote (here one never reached).
tier="tier:shm://$none?size=64MiB+redis://127.0.0.1:1?connect_timeout_ms=200"
for c in stats ls "get k" "inspect k" "rm k" "purge --key-prefix k" \
  "lookup --model m --dtype float32 --rows 2 --cols 2 img1"; do
  # shellcheck disable=SC2086
  check "$c on a tier whose local segment is missing" 1 "the local tier shm://$none?size=64MiB&create=no: shm://$none?size=64MiB&create=no: no such segment \"$none\"" -- --store "$tier" $c
  n=$((n + 1))
  if [ -e "/dev/shm/encache-$none" ]; then
    echo "not ok $n - $c created the local segment of a tier ($(wc -c <"/dev/shm/encache-$none") bytes)"
    fails=$((fails + 1)); "$tool" shm destroy "$none" >/dev/null
  else echo "ok $n - $c created no local segment of a tier"; fi
done
# ... and the URL it prints then hides the remote's password.
n=$((n + 1))
out=$("$tool" --store "tier:shm://$none?size=64MiB+redis://u:sekret@127.0.0.1:1" stats --format prometheus 2>&1)
if printf '%s' "$out" | grep -q sekret ||
   ! printf '%s' "$out" | grep -qF "redis://u:***@127.0.0.1:1"; then
  echo "not ok $n - stats on a tier that cannot be opened hides the password"; printf '%s\n' "$out" | sed 's/^/# /'
  fails=$((fails + 1))
else echo "ok $n - stats on a tier that cannot be opened hides the password"; fi
check "create=no is checked" 1 "create=maybe: must be yes or no" -- --store "shm://$none?create=maybe" put k "$tmp/payload"
# The default Store too, when this machine has none (never touched if it has).
if [ ! -e /dev/shm/encache-encache ]; then
  saved=$ENCACHE_STORE
  ENCACHE_STORE="" # empty: the default Store
  check "stats on the default Store, absent (none named: the fleet, exit 0)" 0 "no such segment \"encache\"" -- stats
  ENCACHE_STORE=$saved
  n=$((n + 1))
  if [ -e /dev/shm/encache-encache ]; then echo "not ok $n - stats created the default segment"; fails=$((fails + 1)); "$tool" shm destroy encache >/dev/null
  else echo "ok $n - stats created no default segment"; fi
fi
# --- the same failure, the same exit status (docs/tool.md): a Store that
# cannot be opened is 1 for every command; an unknown scheme says which
for c in stats "lookup --model m --dtype float32 --rows 2 --cols 2 img1" \
  "publish --model m --dtype float32 --rows 2 --cols 2 --id img1 $tmp/payload" demo bench \
  "purge --key-prefix k"; do
  # shellcheck disable=SC2086
  check "${c%% *} unknown scheme" 1 "unknown Store URL scheme" -- --store "ftp://x" $c
done
check "help is in --help" 0 "Run 'encache help COMMAND'" -- --help
check "config check tensor parallel not a number" 2 "--tensor-parallel-size: must be an integer from 1 to 1048576, got \"x\"" -- config check --ec-transfer-config '{}' --tensor-parallel-size x
echo "1..$n"
echo "# $n checks, $fails failed"
[ "$fails" -eq 0 ]
