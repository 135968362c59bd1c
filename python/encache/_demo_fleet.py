# SPDX-License-Identifier: Apache-2.0
"""The fleet of encoder processes of ``python3 -m encache.demo``.

The encoders are started with multiprocessing's "spawn" context, not
"fork": the parent has imported torch (whose OpenMP and oneDNN thread pools
are not safe to use in a forked child once started) and opened the Store,
and a Cache or Step of the parent cannot be used in a forked child anyway
(encache.ForkError).  A spawned encoder imports torch afresh, builds its
model from the fixed seed and opens its own Cache.  That costs a few
seconds per encoder once: the same processes serve both runs, and the time
before they are ready is not measured.

Each encoder has a pipe to the parent (commands down, replies up) and a
slot of a shared array where it counts the requests it has done, for the
progress line.  Every wait notices an encoder that died, and gives up when
no encoder has moved (done a request or replied) for STALL_S seconds.
"""
import multiprocessing as mp
import multiprocessing.connection
import sys
import time

from ._demo_worker import worker_main

CONTEXT = "spawn"
STALL_S = 600  # the most seconds the fleet waits with no encoder moving


class FleetError(Exception):
    """An encoder failed or died; the message says which and why."""


class Fleet:
    def __init__(self, cfg, encoders):
        ctx = mp.get_context(CONTEXT)
        self.n = encoders
        self.done = ctx.Array("q", encoders, lock=False)
        self.procs, self.conns = [], []
        for i in range(encoders):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=worker_main, args=(cfg, i, child, self.done),
                            name="encache-demo-encoder-%d" % i, daemon=True)
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)

    def wait_ready(self):
        """Waits until every encoder has built its model."""
        self._gather("ready", None, 0)

    def command(self, cmd, reply, label=None, total=0):
        """Sends cmd to every encoder; their replies of kind reply, in
        encoder order.  With a label, shows progress on stderr."""
        for c in self.conns:
            c.send(cmd)
        return self._gather(reply, label, total)

    def _receive(self, i, kind, replies):
        msg = self.conns[i].recv()
        if msg[0] == "error":
            raise FleetError("encoder %d: %s" % (i, msg[1]))
        if msg[0] != kind:
            raise FleetError("encoder %d: answered %r, not %r"
                             % (i, msg[0], kind))
        replies[i] = msg[1]

    def _gather(self, kind, label, total):
        replies = {}
        t0 = last = moved = time.perf_counter()
        tty, seen = sys.stderr.isatty(), -1
        while len(replies) < self.n:
            waiting = [i for i in range(self.n) if i not in replies]
            objs = [self.conns[i] for i in waiting]
            objs += [self.procs[i].sentinel for i in waiting]
            ready = mp.connection.wait(objs, timeout=0.2)
            for i in waiting:
                if self.conns[i] in ready or self.conns[i].poll():
                    self._receive(i, kind, replies)
                elif self.procs[i].sentinel in ready:
                    raise FleetError("encoder %d exited (status %s) without "
                                     "a reply" % (i, self.procs[i].exitcode))
            now = time.perf_counter()
            if sum(self.done) + len(replies) != seen:
                seen, moved = sum(self.done) + len(replies), now
            elif now - moved > STALL_S:
                raise FleetError("no encoder has moved for %d s (waiting for "
                                 "'%s')" % (STALL_S, kind))
            if label and now - last >= (0.2 if tty else 5.0):
                self._progress(label, total, now - t0, tty, False)
                last = now
        if label:
            self._progress(label, total, time.perf_counter() - t0, tty, True)
        return [replies[i] for i in range(self.n)]

    def _progress(self, label, total, elapsed, tty, final):
        done = sum(self.done)
        if tty:
            sys.stderr.write("\r%-20s %5.1f%%  %d/%d requests  %.1f s%s"
                             % (label, 100.0 * done / max(total, 1), done,
                                total, elapsed, "\n" if final else ""))
        else:
            sys.stderr.write("%s: %d/%d requests, %.1f s\n"
                             % (label, done, total, elapsed))
        sys.stderr.flush()

    def close(self):
        """Tells the encoders to quit, and ends any that does not."""
        for c in self.conns:
            try:
                c.send(("quit",))
            except OSError:
                pass
        deadline = time.monotonic() + 10
        for p in self.procs:
            p.join(max(0.1, deadline - time.monotonic()))
            if p.is_alive():
                p.terminate()
                p.join(5)
        for c in self.conns:
            c.close()
