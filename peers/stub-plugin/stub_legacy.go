//go:build devplug_stub_legacy

// The stub's API of Kubernetes 1.34 (peers/build.sh sets the tag for that release): no logger, no context.
package main

import (
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	stub "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
)

// stubPlugin is upstream's stub with the calls main makes, whatever the release's signatures.
type stubPlugin struct{ *stub.Stub }

func newStub(devs []*pluginapi.Device, socket, resourceName string) *stubPlugin {
	return &stubPlugin{stub.NewDevicePluginStub(devs, socket, resourceName, true, true)}
}

func (p *stubPlugin) start() error { return p.Start() }

func (p *stubPlugin) stop() error { return p.Stop() }

func (p *stubPlugin) register(kubeletSocket, resourceName, dir string) error {
	return p.Register(kubeletSocket, resourceName, dir)
}

func (p *stubPlugin) watch(kubeletSocket, resourceName, dir string) {
	p.Watch(kubeletSocket, resourceName, dir)
}
