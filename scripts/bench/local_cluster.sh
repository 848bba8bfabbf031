# A local Ballista cluster for the cluster benches (sourced): a scheduler
# and 2 executors of `sqlfeed` binary BIN, logs and work folders under
# $work, their process ids in `pids`, the scheduler's host:port in
# `address`. A fresh cluster per run keeps each run's executor disk its own.
#
#   start_cluster BIN [SCHEDULER ARG...]    e.g. --job-data-ttl 60
#   stop_cluster
start_cluster() {
  local bin=$1
  shift
  pids=()
  "$bin" scheduler --bind 127.0.0.1:0 "$@" > "$work/scheduler.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 50); do grep -q 'listening on' "$work/scheduler.log" && break; sleep 0.1; done
  address=$(sed -n 's/.*listening on df:\/\/\([0-9.:]*\).*/\1/p' "$work/scheduler.log" | head -1)
  for i in 1 2; do
    rm -rf "$work/executor-$i"
    "$bin" executor --scheduler "$address" --concurrent-tasks 1 \
      --work-dir "$work/executor-$i" > "$work/executor-$i.log" 2>&1 &
    pids+=($!)
  done
  for _ in $(seq 100); do
    [ "$(curl -s "http://$address/api/executors" | grep -o '"host"' | wc -l)" = 2 ] && break
    sleep 0.1
  done
}
stop_cluster() {
  kill "${pids[@]}" 2>/dev/null || true
  wait "${pids[@]}" 2>/dev/null || true
  rm -rf "$work"/executor-1 "$work"/executor-2
}
