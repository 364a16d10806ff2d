#!/usr/bin/env bash
# The lanes of `nox -s e2e`, all at once on the shared seven-node kind cluster (kind-config/e2e.yaml), each on nodes
# of its own, each backend run in a namespace of its own (one after the other where a lane has several):
#   kind          tests/kind (smoke, SIGTERM leftovers, multi-node) on <cluster>-worker, the GPU worker; its plugin
#                 advertises a resource of its own (devplug.io/kind-gpu), so its cluster-wide checks hold meanwhile;
#                 then the DRA suite against dra-example-driver (its chart's DaemonSet) on the same node
#   conformance   the suite on the cluster backend (kubeconfig only) on -worker2, all but the grace test and the
#                 soak (no node left for its copy: it runs in the differential lane)
#   grace         the grace-period test (5 min on a real kubelet) on -worker3; then NVIDIA's plugin with
#                 time-slicing (the checks its replicas concern) on the same node
#   nvidia        NVIDIA's k8s-device-plugin under the whole suite (kind backend; its plain command line) on -worker4
#   differential  the checks only the kind backend runs (kubelet kept down, reboot, the soak with its copy on the
#                 control plane) against the included plugin on -worker5; then the sim-vs-kind differentials and
#                 NVIDIA's plugin with cdi-cri (the allocation checks) on the same node
#   dra           the DRA suite against the included driver (devplug-gpu-plugin --dra, its DaemonSet) on -worker6,
#                 then the DRA sim-vs-kind differential there
# Why seven nodes: one lane each, and the control plane for the soak's copy; every lane starts at once (the DRA
# lane, mostly the kubelet's fixed waits, waited for the soak on the control plane before). Each kind node holds ~14
# inotify instances of the host user's fs.inotify.max_user_instances (nox -s e2e makes sure there are enough).
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
order=()

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
  order+=("$name")
}

node() { echo "$cluster-$1"; }

suite=(
  --pyargs pytest_devplug.conformance --devplug-backend cluster --kubeconfig "$kubeconfig"
  --devplug-allow-disruptive --devplug-plugin-image "$image" --devplug-mock --devplug-pre-start-required
  --devplug-timeout 60 -p no:cacheprovider
)
kind_backend=(--devplug-backend kind --devplug-timeout 60 -p no:cacheprovider)
if [ -n "$workload" ]; then
  suite+=(--devplug-workload-image "$workload")
  kind_backend+=(--devplug-workload-image "$workload")
fi

child() {  # COMMAND...: run COMMAND in this lane, passing SIGTERM on to it; its exit status
  "$@" &
  local pid=$! rc
  trap 'kill -TERM "$pid" 2>/dev/null' TERM
  wait "$pid"
  rc=$?
  while kill -0 "$pid" 2>/dev/null; do wait "$pid"; rc=$?; done
  trap - TERM
  return "$rc"
}

# NVIDIA's test runs `devplug conformance` itself; PYTEST_ADDOPTS reaches that inner pytest run.
nvidia() {  # CONFIG NODE
  PYTEST_ADDOPTS="--devplug-node=$2" child pytest -m kind tests/peers/test_nvidia_plugin.py -k "on_kind and $1" \
    -p no:cacheprovider -rP
}

grace() {
  child pytest "${suite[@]}" --devplug-node "$(node worker3)" -m devplug_grace_period -q || return
  nvidia time-slicing "$(node worker3)"
}

# The DRA suite runs `devplug conformance --dra` itself (tests/dra, tests/peers); PYTEST_ADDOPTS reaches it too.
kind_then_dra_example() {
  child pytest -m kind tests/kind --keep-cluster -p no:cacheprovider || return
  PYTEST_ADDOPTS="--devplug-node=$(node worker)" child pytest -m kind tests/peers/test_dra_example.py -p no:cacheprovider -rP
}

differential() {
  child pytest --pyargs pytest_devplug.conformance "${kind_backend[@]}" --devplug-node "$(node worker5)" \
    --devplug-second-node "$(node control-plane)" -k "kubelet_down or node_reboot or soak" || return
  child pytest -m kind tests/differential "${kind_backend[@]}" --devplug-node "$(node worker5)" \
    --deselect tests/differential/test_dra_differential.py || return
  nvidia cdi-cri "$(node worker5)"
}

dra() {
  PYTEST_ADDOPTS="--devplug-node=$(node worker6)" child pytest -m kind tests/dra/test_included_driver.py \
    -p no:cacheprovider -rP || return
  child pytest -m kind tests/differential/test_dra_differential.py "${kind_backend[@]}" --devplug-node "$(node worker6)"
}

lane kind kind_then_dra_example
lane conformance pytest "${suite[@]}" --devplug-node "$(node worker2)" -m "not devplug_grace_period and not devplug_soak"
lane grace grace
lane nvidia nvidia envvar "$(node worker4)"
lane differential differential
lane dra dra

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

for name in "${order[@]}"; do
  echo "e2e-lanes: $name exit ${rc_of[$name]} in ${seconds_of[$name]} s"
done
exit $failed
