# SPDX-License-Identifier: Apache-2.0
# ports.sh: sourced (bash) by the scripts and tests that start servers on
# loopback ports.

# port_free PORT: nothing listens on 127.0.0.1:PORT.
port_free() {
  ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# free_port START: a free port at or after START whose cluster bus port
# (+10000) is free too.
free_port() {
  p=$1
  while ! port_free "$p" || ! port_free $((p + 10000)); do p=$((p + 1)); done
  echo "$p"
}
