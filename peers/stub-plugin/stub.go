//go:build !devplug_stub_legacy

// The stub's API from Kubernetes 1.35 on: a logger at construction, a context for serving, registering and
// watching (contextual logging).
package main

import (
	"context"

	"k8s.io/klog/v2"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
	stub "k8s.io/kubernetes/pkg/kubelet/cm/devicemanager/plugin/v1beta1"
)

// stubPlugin is upstream's stub with the calls main makes, whatever the release's signatures.
type stubPlugin struct {
	*stub.Stub
	ctx    context.Context
	logger klog.Logger
}

func newStub(devs []*pluginapi.Device, socket, resourceName string) *stubPlugin {
	logger := klog.Background()
	ctx := klog.NewContext(context.Background(), logger)
	return &stubPlugin{stub.NewDevicePluginStub(logger, devs, socket, resourceName, true, true), ctx, logger}
}

func (p *stubPlugin) start() error { return p.Start(p.ctx) }

func (p *stubPlugin) stop() error { return p.Stop(p.logger) }

func (p *stubPlugin) register(kubeletSocket, resourceName, dir string) error {
	return p.Register(p.ctx, kubeletSocket, resourceName, dir)
}

func (p *stubPlugin) watch(kubeletSocket, resourceName, dir string) {
	p.Watch(p.ctx, kubeletSocket, resourceName, dir)
}
