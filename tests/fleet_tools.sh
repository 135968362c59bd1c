#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
# fleet_tools.sh ENCACHE: the fleet commands on a running demo (two encoder
# processes on a private shm Store, publishing into a private statistics
# registry): `encache stats --format prometheus` and the exporter's HTTP
# body parsed by the real parser of python3-prometheus-client, with the
# values checked against the workload (frozen with SIGSTOP so that every
# reader sees the same counters); the exporter's answers, errors and
# signals; `encache top` driven through tmux.  Skips (77) only when tmux
# or the parser is missing.
set -u
tool=$1
py=/usr/bin/python3
if ! command -v tmux >/dev/null 2>&1; then
  echo "1..0 # SKIP tmux is not installed (scripts/install-deps.sh)"; exit 77
fi
if ! "$py" -c 'import prometheus_client.parser' 2>/dev/null; then
  echo "1..0 # SKIP $py cannot import prometheus_client (python3-prometheus-client; scripts/install-deps.sh)"
  exit 77
fi

tmp=$(mktemp -d)
seg=fltools-$$
export ENCACHE_STATS_SEGMENT=encache.fltools-$$
store="shm://$seg?size=64MiB"
sock=fleet-tools-$$
demo_pid="" demo2_pid="" exp_pid=""
cleanup() {
  [ -n "$demo_pid" ] && kill -CONT "$demo_pid" 2>/dev/null
  [ -n "$demo_pid" ] && pkill -KILL -P "$demo_pid" 2>/dev/null
  [ -n "$demo_pid" ] && { kill -KILL "$demo_pid"; wait "$demo_pid"; } 2>/dev/null
  [ -n "$demo2_pid" ] && pkill -KILL -P "$demo2_pid" 2>/dev/null
  [ -n "$demo2_pid" ] && { kill -KILL "$demo2_pid"; wait "$demo2_pid"; } 2>/dev/null
  [ -n "$exp_pid" ] && kill -KILL "$exp_pid" 2>/dev/null
  tmux -L "$sock" kill-server 2>/dev/null
  rm -f "/dev/shm/encache-$seg" "/dev/shm/$ENCACHE_STATS_SEGMENT" \
    "/dev/shm/$ENCACHE_STATS_SEGMENT.utf8"
  rm -rf "$tmp"
}
trap cleanup EXIT
. "$(dirname "$0")/tap.sh"
# The encoder processes of the demo (its children).
encoders() { pgrep -P "$demo_pid" | tr '\n' ' '; }
# Stops the encoders between two Store operations: one stopped inside one
# would hold the shm Store's lock, and the readers would time out.
freeze() {
  for _ in $(seq 30); do
    for p in $(encoders); do kill -STOP "$p"; done
    sleep 0.2
    "$tool" stats --store "$store" >/dev/null 2>&1 && return 0
    for p in $(encoders); do kill -CONT "$p"; done
    sleep 0.1
  done
  return 1
}
thaw() { for p in $(encoders); do kill -CONT "$p"; done; }

# --- a running demo: 2 encoders, enough requests to outlast the test
"$tool" --store "$store" demo --encoders 2 --requests 2000000 --no-baseline \
  --verify none >"$tmp/demo" 2>&1 &
demo_pid=$!
for _ in $(seq 300); do
  "$tool" stats --store "$store" --format json >"$tmp/json" 2>/dev/null &&
    [ "$(grep -o '"hits": [1-9]' "$tmp/json" | wc -l)" -eq 2 ] && break
  sleep 0.1
done
if [ "$(grep -o '"slot"' "$tmp/json" | wc -l)" -eq 2 ]; then ok "the demo's 2 encoders are in the registry"
else not_ok "the demo's encoders never showed up" "$tmp/demo"; exit 1; fi

# --- the exporter
"$tool" exporter --listen 127.0.0.1:0 --store "$store" 2>"$tmp/exp" &
exp_pid=$!
port=""
for _ in $(seq 100); do
  port=$(sed -n 's|.*serving http://127.0.0.1:\([0-9]*\)/metrics.*|\1|p' "$tmp/exp")
  [ -n "$port" ] && break
  sleep 0.1
done
[ -n "$port" ] && ok "exporter listens (port $port)" || not_ok "exporter did not start" "$tmp/exp"

# --- frozen counters: stats, the exporter and ls must agree
freeze || not_ok "could not stop the encoders between two Store operations"
"$tool" stats --store "$store" --format prometheus >"$tmp/prom" 2>"$tmp/err" &&
  ok "stats --format prometheus" || not_ok "stats --format prometheus" "$tmp/err"
"$tool" ls --store "$store" >"$tmp/ls"
"$py" - "$tmp/prom" "$port" "$tmp/ls" "$(encoders)" >"$tmp/py" 2>&1 <<'EOF'
import sys, urllib.request
from prometheus_client.parser import text_string_to_metric_families
path, port, ls, pids = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split()
sizes = [int(line.split("\t")[0]) for line in open(ls)]
objects = len(sizes)

def families(text):
    return {f.name: f for f in text_string_to_metric_families(text)}

def check(fams, where):
    def per_handle(name):
        return {s.labels["pid"]: s.value for s in fams[name].samples
                if s.name == name + "_total" or s.name == name}
    assert fams["encache_handles"].samples[0].value == 2, where
    lookups, cands, hits = (per_handle("encache_" + m) for m in ("lookups", "candidates", "hits"))
    assert sorted(lookups) == sorted(pids), (where, lookups, pids)
    outcomes = ("hits", "misses", "incompatible", "oversize", "unavailable", "skipped", "in_flight")
    timed = {}
    # Histograms: cumulative buckets, +Inf = _count; one observation per
    # lookup (a frozen encoder may be inside one call: counted, not timed).
    for h in ("encache_lookup_duration_seconds", "encache_store_write_duration_seconds"):
        assert fams[h].type == "histogram", h
        for pid in pids:
            ss = [s for s in fams[h].samples if s.labels["pid"] == pid]
            buckets = [s.value for s in ss if s.name == h + "_bucket"]
            count = [s.value for s in ss if s.name == h + "_count"][0]
            assert buckets == sorted(buckets) and buckets[-1] == count, (h, pid)
            assert [s.labels["le"] for s in ss if s.name == h + "_bucket"][-1] == "+Inf"
            if h.startswith("encache_lookup"):
                assert 0 <= lookups[pid] - count <= 1, (pid, lookups[pid], count)
                timed[pid] = count
    # Every candidate has one outcome, but for those of a lookup still
    # running (the demo asks for 1 to 4 images at a time).
    for pid in pids:
        assert lookups[pid] > 0 and 0 < hits[pid] <= cands[pid], (where, pid)
        total = sum(per_handle("encache_" + o)[pid] for o in outcomes)
        running = lookups[pid] - timed[pid]
        assert 0 <= cands[pid] - total <= 4 * running, (where, pid, total, cands[pid])
    # Written objects are counted when reaped: the pending ones may be
    # written already; written bytes are counted by the writer, right
    # after each write (a stopped encoder may be in between: one object).
    written = sum(per_handle("encache_published_written").values())
    pending = sum(per_handle("encache_pending_items").values())
    assert written <= objects <= written + pending, (where, written, pending, objects)
    wbytes = sum(per_handle("encache_written_bytes").values())
    assert sum(sizes) - len(pids) * max(sizes) <= wbytes <= sum(sizes), (where, wbytes, sum(sizes))
    assert fams["encache_store_objects"].samples[0].value == objects, where
    assert fams["encache_store_objects"].samples[0].labels["kind"] == "shm"

text = open(path).read()
check(families(text), "stats")
resp = urllib.request.urlopen("http://127.0.0.1:%s/metrics" % port, timeout=20)
body = resp.read().decode()
assert resp.status == 200 and "version=0.0.4" in resp.headers["Content-Type"], resp.headers
check(families(body), "exporter")
assert body == text, "the exporter serves what stats prints"
print("checked", len(families(text)), "families")
EOF
if [ $? -eq 0 ]; then ok "both outputs parse and match the workload: $(cat "$tmp/py")"
else not_ok "the Prometheus outputs" "$tmp/py"; fi
thaw

# --- the exporter's other answers
"$py" - "$port" >"$tmp/py" 2>&1 <<'EOF'
import socket, sys, urllib.request, urllib.error
port = int(sys.argv[1])
def raw(data, wait=True):
    s = socket.create_connection(("127.0.0.1", port), timeout=20)
    if data:
        s.sendall(data)
    out = b""
    while wait:
        b = s.recv(65536)
        if not b:
            break
        out += b
    s.close()
    return out.decode(errors="replace")
import time
def raw(data, wait=True, timeout=20):
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    if data:
        s.sendall(data)
    out = b""
    while wait:
        b = s.recv(65536)  # socket.timeout: the server did not answer in time
        if not b:
            break
        out += b
    s.close()
    return out.decode(errors="replace")
# Silent clients (connected, sending nothing) do not hold the others up:
# a GET answers within 2 s while 4 of them wait (the exporter gives each
# 2 s for its request head: a server that serves one at a time would need
# 8 s).
silent = [socket.create_connection(("127.0.0.1", port), timeout=20) for _ in range(4)]
time.sleep(0.2)
t0 = time.monotonic()
assert raw(b"GET /nothing HTTP/1.1\r\nHost: x\r\n\r\n", timeout=2).startswith("HTTP/1.1 404"), "404"
got = raw(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", timeout=2)
assert got.startswith("HTTP/1.1 200") and "encache_handles" in got, got[:200]
took = time.monotonic() - t0
# Each silent one is closed at its head's deadline (2 s after it connected).
for c in silent:
    c.settimeout(8)
    assert c.recv(1) == b"", "a silent client was answered"
    c.close()
waited = time.monotonic() - t0
assert 1 <= waited <= 6, waited
# A client that sends its request a byte at a time is cut at 2 s too.
slow = socket.create_connection(("127.0.0.1", port), timeout=10)
t1 = time.monotonic()
try:
    for ch in b"GET /metrics HTTP/1.1\r\nHost: x\r\n":
        slow.sendall(bytes([ch]))
        time.sleep(0.3)
except (BrokenPipeError, ConnectionResetError):
    pass
cut = time.monotonic() - t1
slow.close()
assert 1 <= cut <= 6, cut
# Beyond 16 at once, a new connection takes the place of the oldest idle
# one (closed for it): a scrape gets in while 16 silent clients hold them.
import select
held = []
for _ in range(16):
    held.append(socket.create_connection(("127.0.0.1", port), timeout=20))
    time.sleep(0.01)  # an order of age
t2 = time.monotonic()
time.sleep(0.2)
extra = socket.create_connection(("127.0.0.1", port), timeout=2)
extra.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
assert extra.recv(12) == b"HTTP/1.1 200", "the 17th connection was not served"
extra.close()
closed = select.select(held, [], [], 0.5)[0]
assert held[0] in closed, "the oldest idle connection was kept"
# (all of them once their heads' 2 s are up, on a machine that slow)
assert len(closed) == 1 or time.monotonic() - t2 >= 2, len(closed)
for c in held:
    c.close()
time.sleep(0.2)
assert raw(b"\x16\x03\x01garbage\r\n\r\n").startswith("HTTP/1.1 400"), "400"
assert raw(b"POST /metrics HTTP/1.1\r\n\r\n").startswith("HTTP/1.1 405"), "405"
r = urllib.request.urlopen("http://127.0.0.1:%d/metrics?x=1" % port, timeout=20)
assert r.status == 200
print("404, 400, 405; 4 silent clients: a GET answered in %.2f s, they closed after %.1f s; a byte-a-time client cut after %.1f s; the 17th connection served, the oldest idle one closed" % (took, waited, cut))
EOF
if [ $? -eq 0 ]; then ok "exporter answers: $(cat "$tmp/py")"; else not_ok "exporter answers" "$tmp/py"; fi
expect "exporter: the port is taken" 1 "Address already in use" -- exporter --listen "127.0.0.1:$port"
expect "exporter: non-loopback needs --allow-remote" 2 "add --allow-remote" -- exporter --listen 0.0.0.0:0
expect "exporter: bad --listen" 2 "is not HOST:PORT" -- exporter --listen 9464
expect "stats: bad --format" 2 "\"yaml\" is not one of text, json, prometheus" -- stats --store "$store" --format yaml
kill -TERM "$exp_pid"
for _ in $(seq 50); do kill -0 "$exp_pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$exp_pid" 2>/dev/null; then not_ok "exporter ignores SIGTERM"
else wait "$exp_pid"; st=$?; exp_pid=""
  if [ "$st" -eq 0 ] && grep -q "stopped" "$tmp/exp"; then ok "SIGTERM stops the exporter cleanly"
  else not_ok "exporter after SIGTERM: exit $st" "$tmp/exp"; fi
fi

# --- the fleet without a Store: printed all the same, encache_store_up 0;
# exit 1 when the Store was named, 0 when none was (the default segment
# absent).
"$tool" stats --store "shm://fltools-absent-$$" --format prometheus >"$tmp/prom" 2>"$tmp/err"
st=$?
"$py" - "$tmp/prom" "$(encoders)" >"$tmp/py" 2>&1 <<'EOF'
import sys
from prometheus_client.parser import text_string_to_metric_families
fams = {f.name: f for f in text_string_to_metric_families(open(sys.argv[1]).read())}
up = fams["encache_store_up"].samples[0]
assert up.value == 0 and "fltools-absent" in up.labels["store"], up
assert fams["encache_handles"].samples[0].value == 2
pids = {s.labels["pid"] for s in fams["encache_lookups"].samples}
assert pids == set(sys.argv[2].split()), (pids, sys.argv[2])
print("both encoders, encache_store_up 0")
EOF
if [ $? -eq 0 ] && [ "$st" -eq 1 ] && grep -q "cannot open the Store" "$tmp/err"; then
  ok "stats --format prometheus, a named Store absent: exit 1, $(cat "$tmp/py")"
else not_ok "stats without its Store: exit $st" "$tmp/py"; cat "$tmp/err"; fi
# A Store that opens but does not answer (Redis opens lazily; port 1
# refuses): the fleet all the same, exit 1.
"$tool" stats --store redis://127.0.0.1:1 --format json >"$tmp/json" 2>"$tmp/err"
st=$?
if [ "$st" -eq 1 ] && grep -q "Connection refused" "$tmp/err" &&
   "$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["store"] is None and len(d["handles"]) == 2' "$tmp/json" 2>"$tmp/py"; then
  ok "stats --format json, a Store that does not answer: exit 1, both encoders"
else not_ok "stats with a Store that does not answer: exit $st" "$tmp/py"; cat "$tmp/err"; fi
if [ -e /dev/shm/encache-encache ]; then ok "# SKIP stats with no Store named: the default segment exists here"
else
  env -u ENCACHE_STORE "$tool" stats --format json >"$tmp/json" 2>"$tmp/err"
  st=$?
  if [ "$st" -eq 0 ] && "$py" -c 'import json,sys; d=json.load(open(sys.argv[1])); assert d["store"] is None and len(d["handles"]) == 2' "$tmp/json" 2>"$tmp/py" &&
     env -u ENCACHE_STORE "$tool" stats 2>/dev/null | grep -q "(cannot be opened)"; then
    ok "stats with no Store named: exit 0, the fleet printed (json, text)"
  else not_ok "stats with no Store named: exit $st" "$tmp/py"; fi
fi

# --- names that are not valid UTF-8 (a registry written by a buggy or
# older publisher: the library itself cuts names at character boundaries,
# test_fleet.c): the tools print U+FFFD for each bad byte, so that
# prometheus_client and a JSON parser take the output.  A copy of the
# registry with slot 0 made live (its lock held here) and its encoder label
# replaced; the offsets are those of layout version 1 (src/fleet.c).
"$py" - "/dev/shm/$ENCACHE_STATS_SEGMENT" "/dev/shm/$ENCACHE_STATS_SEGMENT.utf8" "$tool" "$store" >"$tmp/py" 2>&1 <<'EOF'
import fcntl, json, os, struct, subprocess, sys
from prometheus_client.parser import text_string_to_metric_families
src, dst, tool, store = sys.argv[1:5]
data = bytearray(open(src, "rb").read())
name = "\u00e9".encode() * 55 + b"\xc3" + b"-\xff-\xed\xa0\x80-ok"  # cut é, stray, surrogate
slot = 64                          # the header's size: slot 0
data[slot:slot + 16] = struct.pack("<QI4x", 2, 1)   # seq (even), state live
enc = slot + 40                    # seq, state, unused, bytes_written, pid, start_time
data[enc:enc + 128] = name + bytes(128 - len(name))
fd = os.open(dst, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
os.write(fd, bytes(data))
fcntl.fcntl(fd, 37, struct.pack("hhqqi4x", fcntl.F_WRLCK, 0, slot, 1, 0))  # F_OFD_SETLK
seg = os.path.basename(dst)
out = subprocess.run([tool, "stats", "--store", store, "--segment", seg, "--format", "prometheus"],
                     capture_output=True).stdout
text = out.decode("utf-8")          # strict: fails on invalid UTF-8
labels = {s.labels["encoder"] for f in text_string_to_metric_families(text)
          for s in f.samples if "encoder" in s.labels}
want = "\u00e9" * 55 + "\ufffd-\ufffd-\ufffd\ufffd\ufffd-ok"
assert want in labels, labels
js = subprocess.run([tool, "stats", "--store", store, "--segment", seg, "--format", "json"],
                    capture_output=True).stdout.decode("utf-8")
assert want in {h["encoder"] for h in json.loads(js)["handles"]}
print("U+FFFD for each bad byte, in Prometheus and JSON")
EOF
if [ $? -eq 0 ]; then ok "invalid UTF-8 in a label: $(cat "$tmp/py")"
else not_ok "invalid UTF-8 in a label" "$tmp/py"; fi
rm -f "/dev/shm/$ENCACHE_STATS_SEGMENT.utf8"

# --- top through tmux
tmux -L "$sock" new-session -d -s top -x 160 -y 30 \
  "ENCACHE_STATS_SEGMENT=$ENCACHE_STATS_SEGMENT '$tool' top --interval 200; echo top-exited-\$?; sleep 30"
sleep 1.5
tmux -L "$sock" capture-pane -p -t top >"$tmp/cap1"
sleep 1.5
tmux -L "$sock" capture-pane -p -t top >"$tmp/cap2"
rows=0
for p in $(encoders); do grep -q "^[^ ]*@[^ ]* *$p .*%" "$tmp/cap1" && rows=$((rows + 1)); done
if [ "$rows" -eq 2 ] && grep -q "HIT%" "$tmp/cap1"; then ok "top shows both encoders' rows with a hit rate"
else not_ok "top rows ($rows of 2)" "$tmp/cap1"; fi
# The rows change (the clock in the title line aside).
if ! diff <(sed 1d "$tmp/cap1") <(sed 1d "$tmp/cap2") >/dev/null; then ok "top refreshes: the rows change"
else not_ok "top's rows did not change" "$tmp/cap2"; fi
tmux -L "$sock" send-keys -t top q
for _ in $(seq 50); do
  tmux -L "$sock" capture-pane -p -t top >"$tmp/cap3"
  grep -q "top-exited-" "$tmp/cap3" && break
  sleep 0.1
done
if grep -q "top-exited-0" "$tmp/cap3"; then ok "q quits top (exit 0)"; else not_ok "q did not quit top" "$tmp/cap3"; fi
"$tool" top --once >"$tmp/once" 2>&1
st=$?
rows=0
for p in $(encoders); do grep -q "^[^ ]*@[^ ]* *$p .*%" "$tmp/once" && rows=$((rows + 1)); done
if [ "$st" -eq 0 ] && [ "$rows" -eq 2 ]; then ok "top --once prints one frame with both encoders' rows"
else not_ok "top --once: exit $st, $rows rows of 2" "$tmp/once"; fi

# A terminal of 50 x 4: lines cut to 50 columns, the rows that do not fit
# counted on the last line; at 160 x 30 (SIGWINCH) all of it.  Ctrl-\
# (SIGQUIT) ends top with the terminal given back (line mode, echo).
tmux -L "$sock" new-session -d -s narrow -x 50 -y 4 \
  "ENCACHE_STATS_SEGMENT=$ENCACHE_STATS_SEGMENT '$tool' top --interval 200; echo top-exited-\$?; stty -a | grep -q ' icanon' && stty -a | grep -q ' echo ' && echo tty-restored; sleep 30"
sleep 1
tmux -L "$sock" capture-pane -p -t narrow >"$tmp/narrow"
if grep -q "^encache top" "$tmp/narrow" && grep -q "(2 more lines; q quits)" "$tmp/narrow" &&
   grep -q "^ENCODER" "$tmp/narrow" && ! grep -q "STORE" "$tmp/narrow" &&
   [ "$(awk '{ if (length($0) > 50) n++ } END { print n + 0 }' "$tmp/narrow")" -eq 0 ]; then
  ok "top on 50 x 4: lines cut, the rows that do not fit counted"
else not_ok "top on a narrow terminal" "$tmp/narrow"; fi
tmux -L "$sock" resize-window -t narrow -x 160 -y 30 2>/dev/null ||
  tmux -L "$sock" resize-pane -t narrow -x 160 -y 30
sleep 0.6
tmux -L "$sock" capture-pane -p -t narrow >"$tmp/wide"
rows=0
for p in $(encoders); do grep -q "^[^ ]*@[^ ]* *$p .*%" "$tmp/wide" && rows=$((rows + 1)); done
if [ "$rows" -eq 2 ] && grep -q "STORE" "$tmp/wide" && grep -q "^(q quits)" "$tmp/wide"; then
  ok "top redraws at the new size (SIGWINCH)"
else not_ok "top after a resize ($rows rows of 2)" "$tmp/wide"; fi
tmux -L "$sock" send-keys -t narrow 'C-\'
for _ in $(seq 50); do
  tmux -L "$sock" capture-pane -p -t narrow >"$tmp/quit"
  grep -q "top-exited-" "$tmp/quit" && break
  sleep 0.1
done
sleep 0.3
tmux -L "$sock" capture-pane -p -t narrow >"$tmp/quit"
if grep -q "top-exited-0" "$tmp/quit" && grep -q "tty-restored" "$tmp/quit"; then
  ok "Ctrl-\ (SIGQUIT) ends top and gives the terminal back"
else not_ok "top after SIGQUIT" "$tmp/quit"; fi

# Ctrl-Z in an interactive shell: top leaves the alternate screen before
# it stops (the shell's earlier lines show again), fg brings its frame
# back, q ends it with exit 0.
tmux -L "$sock" new-session -d -s job -x 120 -y 12 "bash --norc --noprofile -i"
sleep 0.5
tmux -L "$sock" send-keys -t job "ENCACHE_STATS_SEGMENT=$ENCACHE_STATS_SEGMENT '$tool' top --interval 200" Enter
sleep 1
tmux -L "$sock" capture-pane -p -t job >"$tmp/job1"
tmux -L "$sock" send-keys -t job C-z
sleep 0.5
tmux -L "$sock" capture-pane -p -t job >"$tmp/job2"
tmux -L "$sock" send-keys -t job fg Enter
sleep 1
tmux -L "$sock" capture-pane -p -t job >"$tmp/job3"
tmux -L "$sock" send-keys -t job q
sleep 0.5
tmux -L "$sock" send-keys -t job 'echo top-exited-$?' Enter
sleep 0.5
tmux -L "$sock" capture-pane -p -t job >"$tmp/job4"
if grep -q "^encache top" "$tmp/job1" && grep -q "top --interval" "$tmp/job2" &&
   ! grep -q "^encache top" "$tmp/job2" && grep -q "^encache top" "$tmp/job3" &&
   grep -q "^top-exited-0" "$tmp/job4"; then
  ok "Ctrl-Z gives the terminal back, fg takes it again, q quits"
else not_ok "top and Ctrl-Z / fg" "$tmp/job2"; sed 's/^/# /' "$tmp/job3" "$tmp/job4"; fi

# --- a killed encoder disappears from the registry, the others stay: the
# victim is the one encoder of a second demo (a demo ends its fleet when
# an encoder dies).
"$tool" --store "$store" demo --encoders 1 --requests 2000000 --no-baseline \
  --verify none >"$tmp/demo2" 2>&1 &
demo2_pid=$!
victim=""
for _ in $(seq 300); do
  victim=$(pgrep -P "$demo2_pid")
  [ -n "$victim" ] && "$tool" stats --store "$store" --format prometheus 2>&1 |
    grep -q "^encache_lookups_total{.*pid=\"$victim\"" && break
  sleep 0.1
done
survivors=$(encoders)
kill -KILL "$victim"
sleep 0.3
"$tool" stats --store "$store" --format prometheus >"$tmp/prom" 2>&1
listed=0
for p in $survivors; do grep -q "^encache_lookups_total{.*pid=\"$p\"" "$tmp/prom" && listed=$((listed + 1)); done
if [ -n "$victim" ] && ! grep -q "pid=\"$victim\"" "$tmp/prom" && [ "$listed" -eq 2 ]; then
  ok "a SIGKILLed encoder's slot is gone, the others stay"
else not_ok "killed encoder $victim still listed, or survivors ($listed of 2) gone" "$tmp/prom"; fi
{ kill -KILL "$demo2_pid"; wait "$demo2_pid"; } 2>/dev/null
demo2_pid=""

echo "1..$n"
[ "$fails" -eq 0 ]
