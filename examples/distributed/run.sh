#!/usr/bin/env bash
# Starts 2 shards, 2 actors and a learner of examples/distributed on this machine, each its own
# process (and process group), and waits for them, with a deadline. Cleans up whatever happens:
# every process group it started, and the /dev/shm files of any process that died without
# closing its endpoint.
#
#   examples/distributed/run.sh <path to the distributed binary> [provider]   (default tcp;ofi_rxm)
set -uo pipefail
bin=$1
provider=${2:-tcp;ofi_rxm}
dir=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 -- "-$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do rm -f /dev/shm/"$pid":* 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
start() { setsid "$bin" "$@" & pids+=($!); }
deadline() { timeout 90 tail --pid="$1" -f /dev/null; }

start shard "$dir" 0 "$provider"
start shard "$dir" 1 "$provider"
start actor "$dir" 2 0 300 "$provider"
start actor "$dir" 2 1000 300 "$provider"
status=0
for pid in "${pids[@]:2:2}"; do deadline "$pid"; wait "$pid" || status=1; done
start learner "$dir" 2 50 "$provider"
deadline "${pids[4]}"; wait "${pids[4]}" || status=1
touch "$dir/stop"
for pid in "${pids[@]:0:2}"; do deadline "$pid"; wait "$pid" || status=1; done
echo "distributed example: $([[ $status == 0 ]] && echo passed || echo FAILED) on $provider"
exit $status
