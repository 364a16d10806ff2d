#!/usr/bin/env bash
# The second stage of `nox -s e2e`: four lanes at once on the shared kind cluster (kind-config/e2e.yaml), each on
# a node of its own, each backend run in a namespace of its own:
#   conformance   the suite on the cluster backend (kubeconfig only) on <cluster>-worker2, all but the grace test
#   grace         the grace-period test (5 min on a real kubelet) on <cluster>-worker3, the longest lane
#   nvidia        NVIDIA's k8s-device-plugin under the suite (kind backend) on <cluster>-worker4
#   differential  sim-vs-kind differentials (kind backend) on <cluster>-worker5
# tests/kind ran before, alone: it asserts cluster-wide facts (only its GPU worker advertises GPUs).
# Each lane's output is printed when it ends, then one summary line per lane; exits non-zero if any lane failed.
# SIGINT/SIGTERM: passed on to the lanes as SIGTERM (each pytest run then cleans up its namespace), then waited for.
#
# Usage: e2e-lanes.sh CLUSTER KUBECONFIG PLUGIN_IMAGE [WORKLOAD_IMAGE]   (pytest from PATH: the nox session's)
set -uo pipefail

if [ $# -lt 3 ] || [ $# -gt 4 ]; then
  echo "usage: $0 CLUSTER KUBECONFIG PLUGIN_IMAGE [WORKLOAD_IMAGE]" >&2
  exit 2
fi
cluster=$1 kubeconfig=$2 image=$3 workload=${4:-}
if [ ! -r "$kubeconfig" ]; then
  echo "e2e-lanes: KUBECONFIG $kubeconfig is not a readable file" >&2
  exit 2
fi

logs=$(mktemp -d "${TMPDIR:-/tmp}/devplug-e2e-lanes.XXXXXX")
trap 'rm -rf "$logs"' EXIT
declare -A pid_of=() started=() rc_of=() seconds_of=()

stop() {
  echo "e2e-lanes: stopping the lanes (each removes what it made on the cluster)" >&2
  for name in "${!pid_of[@]}"; do
    kill -TERM "${pid_of[$name]}" 2>/dev/null
  done
}
trap stop INT TERM

lane() {  # NAME COMMAND...: run COMMAND in the background, its output in $logs/NAME.log
  local name=$1
  shift
  "$@" >"$logs/$name.log" 2>&1 &
  pid_of[$name]=$!
  started[$name]=$SECONDS
}

suite=(
  --pyargs pytest_devplug.conformance --devplug-backend cluster --kubeconfig "$kubeconfig"
  --devplug-allow-disruptive --devplug-plugin-image "$image" --devplug-mock --devplug-pre-start-required
  --devplug-timeout 60 -p no:cacheprovider
)
if [ -n "$workload" ]; then
  suite+=(--devplug-workload-image "$workload")
fi
kind_backend=(--devplug-backend kind --devplug-timeout 60 -p no:cacheprovider)

lane conformance pytest "${suite[@]}" --devplug-node "$cluster-worker2" -m "not devplug_grace_period"
lane grace pytest "${suite[@]}" --devplug-node "$cluster-worker3" -m devplug_grace_period -q
# NVIDIA's test runs `devplug conformance` itself; PYTEST_ADDOPTS reaches that inner pytest run.
lane nvidia env PYTEST_ADDOPTS="--devplug-node=$cluster-worker4" \
  pytest -m kind tests/peers/test_nvidia_plugin.py -p no:cacheprovider
lane differential pytest -m kind tests/differential "${kind_backend[@]}" --devplug-node "$cluster-worker5"

failed=0
while [ ${#rc_of[@]} -lt ${#pid_of[@]} ]; do
  running=()
  for name in "${!pid_of[@]}"; do
    [ -n "${rc_of[$name]+set}" ] || running+=("${pid_of[$name]}")
  done
  finished=""
  wait -n -p finished "${running[@]}"
  rc=$?
  if [ -z "${finished:-}" ]; then
    continue  # a signal interrupted the wait: the lanes are told to stop; wait for them
  fi
  for name in "${!pid_of[@]}"; do
    if [ "${pid_of[$name]}" = "$finished" ]; then
      rc_of[$name]=$rc
      seconds_of[$name]=$((SECONDS - started[$name]))
      echo "==================== lane $name: exit $rc after ${seconds_of[$name]} s ===================="
      cat "$logs/$name.log"
      [ "$rc" -eq 0 ] || failed=1
    fi
  done
done

for name in conformance grace nvidia differential; do
  echo "e2e-lanes: $name exit ${rc_of[$name]} in ${seconds_of[$name]} s"
done
exit $failed
