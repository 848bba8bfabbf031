#!/usr/bin/env python3
"""CPU seconds of every process of a cluster run: client, scheduler, executors.

    cluster_cpu.py run NAME=PID [NAME=PID ...] -- COMMAND [ARG ...]
        runs COMMAND (the client) and prints one JSON object: its wall time,
        its CPU seconds (user + system, from the kernel's accounting of
        waited-for children), every named server's CPU seconds spent while
        it ran (from /proc/PID/stat), and the RESULT object the command
        printed (sqlfeed feed --result-json), if any.
    cluster_cpu.py idle SECONDS NAME=PID [NAME=PID ...]
        prints each named server's CPU seconds per second over SECONDS of
        no job: the cost of polling and heartbeats alone.

CPU is what the issue asks to compare (a 2-core machine cannot show a cluster
beating the embedded engine on wall clock, but it can show what every row
costs in all processes together). Linux only (/proc).
"""

import json
import os
import resource
import subprocess
import sys
import time

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid):
    """User + system CPU seconds of a live process (and its reaped children)."""
    with open(f"/proc/{pid}/stat") as f:
        # The command name may hold spaces; the fields after ')' are fixed.
        fields = f.read().rsplit(")", 1)[1].split()
    # utime, stime, cutime, cstime are fields 14-17 (1-based) of the line,
    # 12-15 counted from the state field that follows ')'.
    return sum(int(v) for v in fields[11:15]) / TICKS


def servers(pairs):
    named = {}
    for pair in pairs:
        name, _, pid = pair.partition("=")
        if not pid.isdigit():
            sys.exit(f"cluster_cpu.py: expected NAME=PID, got '{pair}'")
        named[name] = int(pid)
    return named


def children_cpu():
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(pairs, command):
    named = servers(pairs)
    before = {name: cpu_seconds(pid) for name, pid in named.items()}
    client_before = children_cpu()
    start = time.perf_counter()
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    wall = time.perf_counter() - start
    client = children_cpu() - client_before
    after = {name: cpu_seconds(pid) for name, pid in named.items()}
    if done.returncode != 0:
        sys.exit(f"cluster_cpu.py: {command[0]} exited with {done.returncode}")
    result = None
    for line in done.stdout.splitlines():
        if line.startswith("RESULT "):
            result = json.loads(line[len("RESULT ") :])
    print(
        json.dumps(
            {
                "wall_s": wall,
                "client_cpu_s": client,
                "server_cpu_s": {name: after[name] - before[name] for name in named},
                "result": result,
            }
        )
    )


def idle(seconds, pairs):
    named = servers(pairs)
    before = {name: cpu_seconds(pid) for name, pid in named.items()}
    time.sleep(seconds)
    after = {name: cpu_seconds(pid) for name, pid in named.items()}
    print(json.dumps({name: (after[name] - before[name]) / seconds for name in named}))


def main(argv):
    if len(argv) >= 2 and argv[0] == "run" and "--" in argv:
        at = argv.index("--")
        return run(argv[1:at], argv[at + 1 :])
    if len(argv) >= 3 and argv[0] == "idle":
        return idle(float(argv[1]), argv[2:])
    sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
