// Command stub-plugin runs upstream's device-plugin stub (the kubelet's own test double,
// k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1) as a peer for the conformance
// suite: devices on several NUMA nodes, PreStartContainer and GetPreferredAllocation switched on,
// and an Allocate that injects what a test can check. Registration, serving and re-registration
// after a kubelet restart are the stub's own code (Stub.Watch: on a new kubelet.sock it waits 10 s,
// restarts its server and registers again), so the suite meets upstream's behaviour, not ours.
package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"sort"
	"strings"
	"syscall"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

// envDevices is the variable Allocate sets to the container's device IDs, comma-separated.
const envDevices = "STUB_VISIBLE_DEVICES"

func main() {
	pluginDir := flag.String("plugin-dir", pluginapi.DevicePluginPath, "directory holding kubelet.sock and this plugin's socket")
	resourceName := flag.String("resource-name", "example.com/stub", "extended resource to advertise")
	numaNodes := flag.Int("numa-nodes", 2, "NUMA nodes carrying devices")
	perNode := flag.Int("devices-per-numa-node", 2, "devices on each NUMA node")
	klog.InitFlags(nil)
	flag.Parse()
	if *numaNodes < 1 || *perNode < 1 {
		klog.Errorf("-numa-nodes and -devices-per-numa-node must be at least 1 (got %d and %d)", *numaNodes, *perNode)
		os.Exit(2)
	}

	devs := devices(*numaNodes, *perNode)
	dir := filepath.Clean(*pluginDir)
	// The stub watches its socket's directory and compares event names with this exact path.
	kubeletSocket := filepath.Join(dir, "kubelet.sock")
	socket := filepath.Join(dir, "devplug-stub.sock")

	plugin := newStub(devs, socket, *resourceName)
	plugin.SetAllocFunc(allocate)
	plugin.SetGetPreferredAllocFunc(preferred)

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	if err := plugin.start(); err != nil {
		klog.Errorf("serving %s: %v", socket, err)
		os.Exit(1)
	}
	if err := plugin.register(kubeletSocket, *resourceName, dir+"/"); err != nil {
		klog.Errorf("registering %s with %s: %v", *resourceName, kubeletSocket, err)
		_ = plugin.stop()
		os.Exit(1)
	}
	go plugin.watch(kubeletSocket, *resourceName, dir+"/")

	sig := <-sigs
	klog.InfoS("Shutting down", "signal", sig)
	if err := plugin.stop(); err != nil {
		klog.ErrorS(err, "stopping")
		os.Exit(1)
	}
}

// devices lists perNode healthy devices on each of numaNodes NUMA nodes, IDs "numa<n>-dev<i>".
func devices(numaNodes, perNode int) []*pluginapi.Device {
	var devs []*pluginapi.Device
	for n := 0; n < numaNodes; n++ {
		for i := 0; i < perNode; i++ {
			devs = append(devs, &pluginapi.Device{
				ID:       fmt.Sprintf("numa%d-dev%d", n, i),
				Health:   pluginapi.Healthy,
				Topology: &pluginapi.TopologyInfo{Nodes: []*pluginapi.NUMANode{{ID: int64(n)}}},
			})
		}
	}
	return devs
}

// allocate sets STUB_VISIBLE_DEVICES and hands each device in as /dev/stub/<id> (backed by
// /dev/null); an unknown or unhealthy ID fails the whole request, naming the ID.
func allocate(r *pluginapi.AllocateRequest, devs map[string]*pluginapi.Device) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, req := range r.ContainerRequests {
		ids := append([]string(nil), req.DevicesIds...)
		sort.Strings(ids)
		c := &pluginapi.ContainerAllocateResponse{Envs: map[string]string{envDevices: strings.Join(ids, ",")}}
		for _, id := range ids {
			d, ok := devs[id]
			if !ok {
				return nil, status.Errorf(codes.InvalidArgument, "unknown device %q", id)
			}
			if d.Health != pluginapi.Healthy {
				return nil, status.Errorf(codes.InvalidArgument, "device %q is %s", id, d.Health)
			}
			c.Devices = append(c.Devices, &pluginapi.DeviceSpec{
				ContainerPath: "/dev/stub/" + id, HostPath: "/dev/null", Permissions: "rw",
			})
		}
		resp.ContainerResponses = append(resp.ContainerResponses, c)
	}
	return resp, nil
}

// preferred answers exactly allocation_size IDs: the must-include ones, then the rest packed onto
// as few NUMA nodes as possible, filling one node before the next: nodes already holding must-include
// devices first, then the node with the fewest free devices that still fits the rest (best fit), then
// the largest; IDs in a stable order.
func preferred(r *pluginapi.PreferredAllocationRequest, devs map[string]*pluginapi.Device) (*pluginapi.PreferredAllocationResponse, error) {
	resp := &pluginapi.PreferredAllocationResponse{}
	for _, req := range r.ContainerRequests {
		size := int(req.AllocationSize)
		chosen := map[string]bool{}
		var picked []string
		hasMust := map[int64]bool{}
		for _, id := range req.MustIncludeDeviceIDs {
			if !chosen[id] && len(picked) < size {
				chosen[id] = true
				picked = append(picked, id)
				hasMust[numaOf(devs[id])] = true
			}
		}
		byNode := map[int64][]string{}
		for _, id := range req.AvailableDeviceIDs {
			if !chosen[id] {
				n := numaOf(devs[id])
				byNode[n] = append(byNode[n], id)
			}
		}
		nodes := make([]int64, 0, len(byNode))
		for n := range byNode {
			nodes = append(nodes, n)
			sort.Strings(byNode[n])
		}
		need := size - len(picked)
		sort.Slice(nodes, func(i, j int) bool {
			a, b := nodes[i], nodes[j]
			if hasMust[a] != hasMust[b] {
				return hasMust[a]
			}
			fa, fb := len(byNode[a]) >= need, len(byNode[b]) >= need
			if fa != fb {
				return fa
			}
			if len(byNode[a]) != len(byNode[b]) {
				return (len(byNode[a]) < len(byNode[b])) == fa
			}
			return a < b
		})
		for _, n := range nodes {
			for _, id := range byNode[n] {
				if len(picked) < size {
					picked = append(picked, id)
				}
			}
		}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerPreferredAllocationResponse{DeviceIDs: picked})
	}
	return resp, nil
}

// numaOf is the device's first NUMA node, -1 when it has none or is unknown.
func numaOf(d *pluginapi.Device) int64 {
	if d == nil || d.Topology == nil || len(d.Topology.Nodes) == 0 {
		return -1
	}
	return d.Topology.Nodes[0].ID
}
