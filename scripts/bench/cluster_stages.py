#!/usr/bin/env python3
"""Where a Ballista job's time went: per stage, its tasks, task time, rows.

    cluster_stages.py HOST:PORT [JOB_ID]     (default: the newest completed job)
"""
import json
import sys
import urllib.request

address = sys.argv[1]


def get(path):
    with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as response:
        return json.load(response)


if len(sys.argv) > 2:
    job_id = sys.argv[2]
else:
    jobs = [j for j in get("/api/jobs") if j["status"] == "Completed"]
    job = max(jobs, key=lambda j: j["start_time"])
    job_id = job["job_id"]
    print(f"  job {job_id}: {job['job_status']}, wall {(job['end_time'] - job['start_time']) / 1000:.2f}s")
for stage in get(f"/api/job/{job_id}/stages")["stages"]:
    tasks = [t for t in stage.get("tasks", []) if t]
    busy = sum(t.get("exec_duration", 0) for t in tasks) / 1000
    longest = max((t.get("exec_duration", 0) for t in tasks), default=0) / 1000
    plan = [line.strip() for line in (stage.get("stage_plan") or "").splitlines()]
    top = plan[1] if len(plan) > 1 else (plan[0] if plan else "")
    print(f"  stage {stage['stage_id']}: {len(tasks)} task(s), task time {busy:.2f}s "
          f"(longest {longest:.2f}s), rows in {stage.get('input_rows', 0):,} "
          f"out {stage.get('output_rows', 0):,}; under the writer: {top[:60]}")
