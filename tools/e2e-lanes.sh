#!/usr/bin/env bash
# The lanes of `nox -s e2e`, all at once on the shared seven-node kind cluster (kind-config/e2e.yaml), each on nodes
# of its own, each backend run in a namespace of its own (one after the other where a lane has several):
#   kind          tests/kind (smoke, SIGTERM leftovers, multi-node) on <cluster>-worker, the GPU worker; its plugin
#                 advertises a resource of its own (devplug.io/kind-gpu), so its cluster-wide checks hold meanwhile;
#                 then dra-example-driver (its chart's DaemonSet) under the DRA checks of $dra_shared and
#                 $dra_example on the same node
#   conformance   the suite on the cluster backend (kubeconfig only) on -worker2, all but the grace test and the
#                 soak (no node left for its copy: it runs in the differential lane); then the registration checks
#                 with the included plugin registering through the kubelet's plugin watcher, on the same node
#   grace         the grace-period test (5 min on a real kubelet) on -worker3; then the DRA sim-vs-kind
#                 differential and NVIDIA's DRA driver (its chart's DaemonSet) on the same node
#   nvidia        NVIDIA's k8s-device-plugin under the whole suite (kind backend; its plain command line) on -worker4;
#                 then upstream's stub advertising one device under the whole suite on the same node
#   differential  the checks only the kind backend runs (kubelet kept down, reboot, the soak with its copy on the
#                 control plane) against the included plugin on -worker5; then the sim-vs-kind differentials and
#                 NVIDIA's plugin with cdi-cri (the allocation checks) on the same node
#   dra           the included driver (devplug-gpu-plugin --dra, its DaemonSet) under the DRA checks of $dra_shared
#                 and $dra_included on -worker6; then NVIDIA's plugin with time-slicing (the checks its replicas
#                 concern) on the same node
# The DRA suite's checks are split between the two drivers (each check on a real kubelet once; registration and
# slices, which cost seconds, on both): each driver runs the whole suite on the embedded kubelet in `nox -s tests`,
# and two whole runs on kind cost ~15 min of lane time at the kubelet's fixed periods.
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

# The DRA suite's checks on kind, each on a real kubelet once (DEVPLUG_DRA_CHECKS, tests/support.py): registration
# and the published slices (no pods: seconds) for both drivers, the rest of the quick core split between them.
dra_shared="test_driver_registers_with_the_kubelet test_slices_published"
# the fault checks (only the included driver has a fault injector), two kubelet restarts, half the quick core
dra_included="test_failed_prepare_keeps_pod_pending_then_runs test_prepare_retried_after_kubelet_restart
  test_failed_unprepare_is_retried test_unprepare_retried_after_kubelet_restart test_device_health_reaches_pod_status
  test_device_health_unknown_after_driver_stops test_reregisters_after_kubelet_restart
  test_checkpoint_survives_kubelet_restart test_recovers_after_refused_registration
  test_claim_from_template test_prepare_is_idempotent test_unprepared_when_pod_deleted_and_unprepare_is_idempotent
  test_extended_resource_served_by_the_driver test_claim_with_several_requests test_prioritized_list_gets_the_next_choice
  test_admin_access_leaves_the_pod_using_the_device_alone test_noexecute_taint_evicts_the_pod_and_unprepares_its_claim
  test_unprepare_after_a_restart_removes_the_claims_cdi_specs test_pods_come_back_with_their_devices_after_a_node_reboot
  test_checkpoint_contents test_device_status_keeps_what_others_wrote
  test_slices_come_back_after_an_update_then_a_kubelet_start"
# the driver's own restarts, its slices across the kubelet's and its own restarts, the kubelet kept down, the other
# half of the quick core
dra_example="test_reregisters_after_driver_restart test_abrupt_kill_then_start_registers_again
  test_node_slices_removed_on_kubelet_start_then_published_again test_slices_removed_after_driver_stops
  test_slices_kept_when_driver_restarts_quickly test_unprepare_for_pod_deleted_while_kubelet_down
  test_pod_created_while_kubelet_down_runs test_pod_deleted_while_kubelet_down_is_never_prepared
  test_device_health_reported_as_device_taints
  test_claim_prepared_and_container_sees_it test_claim_for_two_devices test_shared_claim
  test_unsatisfiable_claim_stays_unschedulable test_device_taint_keeps_claims_off_tainted_devices
  test_devices_prepared_again_for_a_new_claim_after_cleanup"

grace() {
  child pytest "${suite[@]}" --devplug-node "$(node worker3)" -m devplug_grace_period -q || return
  child pytest -m kind tests/differential/test_dra_differential.py "${kind_backend[@]}" --devplug-node "$(node worker3)" || return
  PYTEST_ADDOPTS="--devplug-node=$(node worker3)" child pytest -m kind tests/peers/test_nvidia_dra.py -p no:cacheprovider -rP
}

# The DRA suite runs `devplug conformance --dra` itself (tests/dra, tests/peers); PYTEST_ADDOPTS reaches it too.
kind_then_dra_example() {
  child pytest -m kind tests/kind --keep-cluster -p no:cacheprovider || return
  PYTEST_ADDOPTS="--devplug-node=$(node worker)" DEVPLUG_DRA_CHECKS="$dra_shared $dra_example" \
    child pytest -m kind tests/peers/test_dra_example.py -p no:cacheprovider -rP
}

differential() {
  child pytest --pyargs pytest_devplug.conformance "${kind_backend[@]}" --devplug-node "$(node worker5)" \
    --devplug-second-node "$(node control-plane)" -k "kubelet_down or node_reboot or soak" || return
  child pytest -m kind tests/differential "${kind_backend[@]}" --devplug-node "$(node worker5)" \
    --deselect tests/differential/test_dra_differential.py || return
  nvidia cdi-cri "$(node worker5)"
}

# NVIDIA's plugin, then upstream's stub with one device (tests/peers/test_peers.py) on the same node
nvidia_then_one_device() {
  nvidia envvar "$(node worker4)" || return
  PYTEST_ADDOPTS="--devplug-node=$(node worker4)" child pytest -m kind tests/peers/test_peers.py -k one_device_stub_on_kind \
    -p no:cacheprovider -rP
}

# The suite; then its registration and restart checks with the included plugin registering through the kubelet's
# plugin watcher (DP_REGISTRATION=plugins_registry), as NIC plugins do, on the same node.
conformance() {
  child pytest "${suite[@]}" --devplug-node "$(node worker2)" -m "not devplug_grace_period and not devplug_soak" || return
  PYTEST_ADDOPTS="--devplug-node=$(node worker2)" child pytest -m kind tests/pytest_plugin/test_watcher_registration_suite.py \
    -p no:cacheprovider -rP
}

dra() {
  PYTEST_ADDOPTS="--devplug-node=$(node worker6)" DEVPLUG_DRA_CHECKS="$dra_shared $dra_included" \
    child pytest -m kind tests/dra/test_included_driver.py -p no:cacheprovider -rP || return
  nvidia time-slicing "$(node worker6)"
}

lane kind kind_then_dra_example
lane conformance conformance
lane grace grace
lane nvidia nvidia_then_one_device
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
