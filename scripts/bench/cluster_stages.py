#!/usr/bin/env python3
"""Where a Ballista job's time went: per stage its tasks, task time and rows,
and per operator the compute time and bytes its metrics report.

    cluster_stages.py HOST:PORT [JOB_ID] [--rows N] [--work-dir DIR ...]
        (default job: the newest completed one)

With --rows (the epoch's rows), every operator's elapsed_compute (and a
shuffle writer's write_time, a reader's fetch_time) is also given in
microseconds per epoch row, the unit of the issue's CPU-per-row goal. With
--work-dir (an executor's, repeatable), the bytes each stage left in shuffle
files are summed per stage (written once, read once by the next stage).
"""
import json
import os
import re
import sys
import urllib.request

args = sys.argv[1:]
address = args.pop(0)
rows = None
work_dirs = []
job_id = None
while args:
    arg = args.pop(0)
    if arg == "--rows":
        rows = int(args.pop(0))
    elif arg == "--work-dir":
        work_dirs.append(args.pop(0))
    else:
        job_id = arg


def get(path):
    with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as response:
        return json.load(response)


UNITS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0}
SIZES = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def value(text):
    """A metric's value: seconds for durations, a number for counts and bytes."""
    text = text.strip()
    m = re.fullmatch(r"([0-9.]+)\s*(ns|µs|us|ms|s)", text)
    if m:
        return float(m.group(1)) * UNITS[m.group(2)]
    m = re.fullmatch(r"([0-9.]+)\s*([KMBGT]?)(?:i?B)?", text)
    if m:
        return float(m.group(1)) * SIZES[m.group(2)]
    return None


def operators(plan):
    """(operator name, {metric: value}) per line of a metrics-rendered plan."""
    for line in plan.splitlines():
        name = line.strip().split(":", 1)[0].split(",", 1)[0]
        m = re.search(r"metrics=\[(.*)\]\s*$", line)
        metrics = {}
        if m:
            for item in re.split(r",\s*(?=[a-z_]+=)", m.group(1)):
                key, _, raw = item.partition("=")
                parsed = value(raw)
                if parsed is not None:
                    metrics[key.strip()] = parsed
        yield name, metrics


if job_id is None:
    jobs = [j for j in get("/api/jobs") if j["status"] == "Completed"]
    job = max(jobs, key=lambda j: j["start_time"])
    job_id = job["job_id"]
    print(f"  job {job_id}: {job['job_status']}, wall {(job['end_time'] - job['start_time']) / 1000:.2f}s")
per_row = (lambda s: f" = {1e6 * s / rows:.1f} us/row") if rows else (lambda s: "")
TIMES = ("elapsed_compute", "write_time", "fetch_time", "local_read_time", "repart_time")
BYTES = ("decoded_bytes", "bytes_scanned", "spilled_bytes")
total = 0.0
for stage in get(f"/api/job/{job_id}/stages?plan_format=metrics")["stages"]:
    tasks = [t for t in stage.get("tasks", []) if t]
    busy = sum(t.get("exec_duration", 0) for t in tasks) / 1000
    longest = max((t.get("exec_duration", 0) for t in tasks), default=0) / 1000
    print(f"  stage {stage['stage_id']}: {len(tasks)} task(s), task time {busy:.2f}s{per_row(busy)} "
          f"(longest {longest:.2f}s), rows in {stage.get('input_rows', 0):,} "
          f"out {stage.get('output_rows', 0):,}")
    stage_compute = 0.0
    for name, metrics in operators(stage.get("stage_plan") or ""):
        shown = [f"{k} {metrics[k]:.3f}s{per_row(metrics[k])}" for k in TIMES if metrics.get(k)]
        shown += [f"{k} {metrics[k] / 1e6:.1f} MB" for k in BYTES if metrics.get(k)]
        stage_compute += metrics.get("elapsed_compute", 0.0)
        if shown:
            print(f"    {name}: {', '.join(shown)}")
    total += stage_compute
    if work_dirs:
        written = 0
        folders = [os.path.join(w, job_id, str(stage["stage_id"])) for w in work_dirs]
        for folder in folders:
            for root, _, files in os.walk(folder):
                written += sum(os.path.getsize(os.path.join(root, f)) for f in files)
        if not any(os.path.isdir(folder) for folder in folders):
            # Sort-based shuffle files of a stage are gone once the job ends.
            print("    shuffle files written: removed by the executors after the job")
        else:
            note = f" = {written / rows:.0f} B/row" if rows else ""
            print(f"    shuffle files written: {written / 1e6:.1f} MB{note}")
print(f"  elapsed_compute of all operators: {total:.2f}s{per_row(total)}")
