#!/bin/sh
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
# spaces squeezed to one so that column alignment does not matter).
check() {
  name=$1 want=$2 needle=$3
  shift 4
  n=$((n + 1))
  out=$("$tool" "$@" 2>&1)
  got=$?
  out=$(printf '%s' "$out" | tr -s ' ')
  if [ "$got" -ne "$want" ]; then
    echo "not ok $n - $name: exit $got, expected $want"; echo "$out" | sed 's/^/# /'
    fails=$((fails + 1))
  elif ! printf '%s' "$out" | grep -qF -- "$needle"; then
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

# --- key: both normative vectors of spec/v3-format.md
exact "key vector with prefix" \
  "team@cache@embedding@model:shared/model@revision:rev:1@encoder:encoder:default@dtype:torch.float32@protocol:v3@id:image@1" \
  -- key --prefix team@cache --model shared/model --revision rev:1 --dtype float32 --id image@1
exact "key vector without prefix" \
  "embedding@model:shared/model@revision:default@encoder:encoder:default@dtype:torch.float32@protocol:v3@id:image@1" \
  -- key --model shared/model --dtype float32 --id image@1
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

# --- global
check "--help" 0 "Commands:" -- --help
check "--version" 0 "encache 0.1.0" -- --version
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
for bad in 0 -1 1.5 '"8"' true; do
  check "config refuses pending items $bad" 2 \
    "ec_connector_extra_config.store_max_pending_items: must be a positive integer" \
    -- config check --ec-transfer-config "{\"ec_connector_extra_config\":{\"store_max_pending_items\":$bad}}"
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

echo "1..$n"
echo "# $n checks, $fails failed"
[ "$fails" -eq 0 ]
