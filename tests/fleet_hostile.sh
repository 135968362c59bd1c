#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# fleet_hostile.sh ENCACHE: the fleet commands against a hostile host
# (issue 26): a FIFO, a symbolic link or another user's file at the
# registry's name; labels that carry terminal escapes, newlines and
# invalid UTF-8; a client flooding the exporter's connections; Store URLs
# that cannot be opened; a shm segment whose header counters are damaged.
# Real processes, a real FIFO, a real segment; the other uid's case runs
# as root only (CI) and needs no user of that uid: a registry is chowned
# to uid 65534 and read as that uid through setpriv.  Skips (77) only when
# python3-prometheus-client is missing.
set -u
tool=$1
py=/usr/bin/python3
if ! "$py" -c 'import prometheus_client.parser' 2>/dev/null; then
  echo "1..0 # SKIP $py cannot import prometheus_client (python3-prometheus-client; scripts/install-deps.sh)"
  exit 77
fi

tmp=$(mktemp -d)
reg=encache.flhostile-$$
seg=flhostile-$$
store="shm://$seg?size=4MiB"
export ENCACHE_STATS_SEGMENT=$reg
unset ENCACHE_STORE
bg_pids=""
cleanup() {
  for p in $bg_pids; do kill -KILL "$p" 2>/dev/null; done
  rm -f "/dev/shm/encache-$seg" "/dev/shm/encache-$seg-t" /dev/shm/$reg /dev/shm/$reg.*
  rm -rf "$tmp"
}
trap cleanup EXIT
. "$(dirname "$0")/tap.sh"
# Starts the exporter on registry $1 (any free port); sets exp_pid, port.
start_exporter() {
  "$tool" exporter --listen 127.0.0.1:0 --segment "$1" 2>"$tmp/exp" &
  exp_pid=$!
  bg_pids="$bg_pids $exp_pid"
  port=""
  for _ in $(seq 100); do
    port=$(sed -n 's|.*serving http://127.0.0.1:\([0-9]*\)/metrics.*|\1|p' "$tmp/exp")
    [ -n "$port" ] && break
    sleep 0.1
  done
}
stop_exporter() { kill -TERM "$exp_pid" 2>/dev/null; wait "$exp_pid" 2>/dev/null; }
# scrape PORT: the status line and body of GET /metrics (20 s at most).
scrape() {
  "$py" - "$1" <<'EOF'
import sys, urllib.request, urllib.error
try:
    r = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % sys.argv[1], timeout=20)
    print(r.status); print(r.read().decode())
except urllib.error.HTTPError as e:
    print(e.code); print(e.read().decode())
EOF
}

# A Store with a few objects, and a registry of ours: made by one real
# engine handle (a lookup), its slot free again once it exits.
head -c 1000 /dev/urandom >"$tmp/obj"
for k in a b c; do "$tool" --store "$store" put "k-$k" "$tmp/obj" >/dev/null; done
"$tool" --store "$store" lookup --model m --dtype float32 --rows 1 --cols 1 x \
  >"$tmp/out" 2>&1
if [ -f "/dev/shm/$reg" ]; then ok "a real registry and a real Store to start from"
else not_ok "no registry was made" "$tmp/out"; exit 1; fi

# --- finding 7: what lies at the registry's name
mkfifo "/dev/shm/$reg.fifo"
expect "stats, a FIFO at the registry's name" 0 "a FIFO, not a registry" -- \
  stats --segment "$reg.fifo"
expect "top --once, a FIFO at the registry's name" 1 "a FIFO, not a registry" -- \
  top --once --segment "$reg.fifo"
start_exporter "$reg.fifo"
timeout 30 bash -c "$(declare -f scrape); py=$py; scrape $port" >"$tmp/got" 2>&1
if [ "$(head -1 "$tmp/got")" = 500 ] && grep -q "a FIFO, not a registry" "$tmp/got"; then
  ok "the exporter, a FIFO at the registry's name: 500 and why"
else not_ok "the exporter on a FIFO" "$tmp/got"; fi
stop_exporter
ln -s "/dev/shm/$reg" "/dev/shm/$reg.link"
expect "stats, a symbolic link at the registry's name" 0 "a symbolic link, not a registry" -- \
  stats --segment "$reg.link"
cp "/dev/shm/$reg" "/dev/shm/$reg.open"
chmod 0606 "/dev/shm/$reg.open"
expect "stats, a registry others may write" 0 "writable by group or others (mode 0606)" -- \
  stats --segment "$reg.open"
if [ "$(id -u)" -ne 0 ]; then ok "# SKIP another uid's registry: needs root (chown)"
else
  cp "/dev/shm/$reg" "/dev/shm/$reg.other"
  chown 65534:65534 "/dev/shm/$reg.other"
  expect "stats, another uid's registry" 0 "owned by uid 65534, not by this process's user (uid 0)" -- \
    stats --segment "$reg.other"
  expect "top --once, another uid's registry" 1 "owned by uid 65534" -- \
    top --once --segment "$reg.other"
  # ... which its owner reads (what docs/engine.md tells root to do).
  if ! command -v setpriv >/dev/null 2>&1; then ok "# SKIP reading it as its owner: no setpriv"
  else
    timeout 20 setpriv --reuid=65534 --regid=65534 --clear-groups \
      "$tool" top --once --segment "$reg.other" >"$tmp/out" 2>&1
    st=$?
    if [ "$st" -eq 126 ] || [ "$st" -eq 127 ]; then ok "# SKIP reading it as its owner: uid 65534 cannot run $tool"
    elif [ "$st" -eq 0 ] && grep -q "^ENCODER" "$tmp/out"; then ok "its owner (uid 65534, setpriv) reads it"
    else not_ok "uid 65534 reading its own registry: exit $st" "$tmp/out"; fi
  fi
fi
expect "stats, our own registry" 0 "store" -- stats --segment "$reg"

# --- finding 8: labels that would drive the terminal.  encoder_name takes
# any string, and a damaged registry any bytes: a copy of our registry
# with three slots made live (their locks held here) and their labels
# replaced; the offsets are those of layout version 1 (src/fleet.c).
cp "/dev/shm/$reg" "/dev/shm/$reg.labels"
"$py" - "/dev/shm/$reg.labels" "$tool" >"$tmp/py" 2>&1 <<'EOF'
import fcntl, json, os, re, struct, subprocess, sys
from prometheus_client.parser import text_string_to_metric_families
path, tool = sys.argv[1:3]
seg = os.path.basename(path)
evil = b"evil\x1b]0;pwned\x07\x1b[2J\r\nFAKE-ROW 1 2 3"
evil_store = b"shm://x\x1b[31mred\xc2\x9b\xff"   # C1 CSI, a stray byte
labels = [(evil, evil_store), ("\u00e9" * 30).encode(), ("\u00fc" * 10).encode()]
labels = [labels[0], (labels[1], b"shm://wide"), (labels[2], "shm://\u00fc".encode())]
fd = os.open(path, os.O_RDWR)
slot_size = struct.unpack_from("<I", os.pread(fd, 64, 0), 20)[0]
for i, (enc, store) in enumerate(labels):
    off = 64 + i * slot_size
    os.pwrite(fd, struct.pack("<QI4xQqQ", 2, 1, 0, 4242 + i, 0), off)
    os.pwrite(fd, enc + bytes(128 - len(enc)) + store + bytes(256 - len(store)), off + 40)
    fcntl.fcntl(fd, 37, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, off, 1, 0))  # F_OFD_SETLK
def run(*args):
    out = subprocess.run([tool, *args, "--segment", seg], capture_output=True, timeout=20).stdout
    text = out.decode("utf-8")                  # strict: valid UTF-8 or it fails
    bad = [c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) <= 0x9f]
    assert not bad, ("control characters reach the terminal", args, bad, text)
    return text
shown = r"evil\x1b]0;pwned\x07\x1b[2J\r\nFAKE-ROW 1 2 3"
shown_store = "shm://x\\x1b[31mred\\u009b\ufffd"
# stats (text): one line per handle, the label escaped, columns by characters
lines = run("stats").splitlines()
rows = [l for l in lines if re.search(r" 424[234] ", l)]
assert len(rows) == 3 and not any(l.startswith("FAKE-ROW") for l in lines), lines
assert rows[0].startswith(shown + " ") and rows[0].endswith("  " + shown_store), rows[0]
assert rows[2][:24] == "\u00fc" * 10 + " " * 14 and rows[2][24:33] == "     4244", rows[2]
assert rows[2].endswith("  shm://\u00fc"), rows[2]
# top: the encoder cut to 20 characters, never inside one; columns by characters
lines = run("top", "--once").splitlines()
rows = {int(l[21:29]): l for l in lines[2:]}
assert sorted(rows) == [4242, 4243, 4244] and not any(l.startswith("FAKE-ROW") for l in lines), lines
assert rows[4243][:21] == "\u00e9" * 20 + " ", rows[4243]
assert rows[4242][:20] == shown[:20] and rows[4242].endswith("  " + shown_store), rows[4242]
assert rows[4244][:21] == "\u00fc" * 10 + " " * 11, rows[4244]
# Prometheus: parses; newline, quote and backslash exact (the format has
# escapes for them), other control characters as their escapes' text
text = run("stats", "--format", "prometheus")
got = {s.labels["pid"]: (s.labels["encoder"], s.labels["store"])
       for f in text_string_to_metric_families(text) for s in f.samples if "pid" in s.labels}
assert got["4242"] == (r"evil\x1b]0;pwned\x07\x1b[2J\r" + "\nFAKE-ROW 1 2 3", shown_store), got["4242"]
assert got["4243"][0] == "\u00e9" * 30, got["4243"]
# JSON: exact (every control character escaped as \u00XX), U+FFFD for bad bytes
h = {x["pid"]: x for x in json.loads(run("stats", "--format", "json"))["handles"]}
assert h[4242]["encoder"] == evil.decode() and h[4242]["store"] == "shm://x\x1b[31mred\u009b\ufffd", h[4242]
print("stats, top, prometheus and json: no control character, valid UTF-8, columns by characters")
EOF
if [ $? -eq 0 ]; then ok "hostile labels: $(cat "$tmp/py")"
else not_ok "hostile labels" "$tmp/py"; fi

# --- finding 6: a client that holds 16 idle connections to the exporter
# (as many as it serves at once) and opens a new one the moment one is
# closed; meanwhile scrapes from another process must be answered.
start_exporter "$reg"
"$py" - "$port" "$tmp/flood" <<'EOF' &
import selectors, socket, sys, time
port, report = int(sys.argv[1]), sys.argv[2]
sel = selectors.DefaultSelector()
def conn():
    s = socket.create_connection(("127.0.0.1", port))
    sel.register(s, selectors.EVENT_READ)
for _ in range(16):
    conn()
reopened, last = 0, 0.0
while True:
    for key, _ in sel.select(timeout=0.2):
        s = key.fileobj
        try:
            data = s.recv(4096)
        except OSError:
            data = b""
        if not data:                    # closed by the exporter: again
            sel.unregister(s)
            s.close()
            conn()
            reopened += 1
    if time.monotonic() - last > 0.2:
        open(report, "w").write("%d %d\n" % (len(sel.get_map()), reopened))
        last = time.monotonic()
EOF
flood_pid=$!
bg_pids="$bg_pids $flood_pid"
for _ in $(seq 50); do [ -s "$tmp/flood" ] && break; sleep 0.1; done
sleep 1 # the flood in place
"$py" - "$port" >"$tmp/py" 2>&1 <<'EOF'
import sys, time, urllib.request
port = sys.argv[1]
t0 = time.monotonic()
tries, served, first = 0, 0, None
while time.monotonic() - t0 < 6:      # three head deadlines of the flood
    tries += 1
    time.sleep(0.3)
    try:
        r = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port, timeout=3)
        if r.status == 200 and b"encache_handles" in r.read():
            served += 1
            first = first or time.monotonic() - t0
    except OSError as e:
        print("scrape %d: %s" % (tries, e))
assert served >= 1 and first <= 5, (served, tries, first)
print("%d of %d scrapes served during the flood, the first after %.2f s" % (served, tries, first))
EOF
st=$?
sleep 0.5
flood=$(cat "$tmp/flood")
kill "$flood_pid"; wait "$flood_pid" 2>/dev/null
if [ "$st" -eq 0 ] && [ "${flood%% *}" -eq 16 ] && [ "${flood##* }" -ge 16 ]; then
  ok "exporter flood (16 idle connections, reopened at once; $(echo "$flood" | cut -d' ' -f2) reopened): $(tail -1 "$tmp/py")"
else not_ok "exporter flood: 16 idle connections starve the scrapes (flooder: $flood)" "$tmp/py"; fi
stop_exporter

# --- finding 9: the URL of a Store that cannot be opened, as given (a
# password redacted), in the text and in encache_store_up's label: it was
# uninitialised memory for every URL but a plain shm:// one.
while IFS='|' read -r url shown; do
  env -u MOONCAKE_CONFIG_PATH "$tool" --store "$url" stats >"$tmp/text" 2>"$tmp/err"
  st_text=$?
  env -u MOONCAKE_CONFIG_PATH "$tool" --store "$url" stats --format prometheus \
    >"$tmp/prom" 2>>"$tmp/err"
  st_prom=$?
  "$py" - "$tmp/text" "$tmp/prom" "$shown" >"$tmp/py" 2>&1 <<'EOF'
import sys
from prometheus_client.parser import text_string_to_metric_families
text, prom, shown = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read(), sys.argv[3]
line = text.decode().splitlines()[0]
assert line == "%-13s %s (cannot be opened)" % ("store", shown), (line, shown)
fams = {f.name: f for f in text_string_to_metric_families(prom.decode())}
up = fams["encache_store_up"].samples[0]
assert up.labels["store"] == shown and up.value == 0, (up.labels, shown)
assert b"sekret" not in text + prom
print(shown)
EOF
  if [ $? -eq 0 ] && [ "$st_text" -eq 1 ] && [ "$st_prom" -eq 1 ]; then
    ok "stats, a Store that cannot be opened: $(cat "$tmp/py")"
  else not_ok "stats with $url: exit $st_text, $st_prom" "$tmp/py"; sed 's/^/# /' "$tmp/text" "$tmp/err"; fi
done <<EOF
tier:shm://$seg-t?size=4MiB+redis://127.0.0.1:notaport|tier:shm://$seg-t?size=4MiB+redis://127.0.0.1:notaport
nosuch://x|nosuch://x
mooncake:|mooncake:
redis://:sekret@127.0.0.1:notaport|redis://:***@127.0.0.1:notaport
shm://$seg-absent?create=no|shm://$seg-absent?create=no
EOF

# --- finding 9: damaged counters in a real segment's header (evictions,
# reinsertions, repairs: 8 bytes each, 32 bytes after the ring head at
# 192: shm.h): stats never prints them; they restart, the repair counted.
"$py" - "/dev/shm/encache-$seg" <<'EOF'
import struct, sys
with open(sys.argv[1], "r+b") as f:
    f.seek(224)
    f.write(struct.pack("<QQQ", 0x8BADF00DDEADBEEF, 0xFFFFFFFFFFFFFFFE, 0x4141414141414141))
EOF
"$tool" --store "$store" stats >"$tmp/text" 2>&1
st=$?
"$tool" --store "$store" stats --format json >"$tmp/json" 2>>"$tmp/text"
"$py" - "$tmp/text" "$tmp/json" >"$tmp/py" 2>&1 <<'EOF'
import json, sys
text = dict(l.split(None, 1) for l in open(sys.argv[1]) if l.strip())
got = {k: int(text[k]) for k in ("objects", "evictions", "reinsertions", "repairs")}
assert got == {"objects": 3, "evictions": 0, "reinsertions": 0, "repairs": 1}, got
js = json.load(open(sys.argv[2]))["store"]
assert (js["evictions_total"], js["reinsertions_total"], js["repairs_total"]) == (0, 0, 1), js
print(got)
EOF
if [ $? -eq 0 ] && [ "$st" -eq 0 ]; then ok "stats after damage to the shm header's counters: $(cat "$tmp/py")"
else not_ok "stats after damage to the shm header's counters: exit $st" "$tmp/py"; sed 's/^/# /' "$tmp/text"; fi

echo "1..$n"
[ "$fails" -eq 0 ]
