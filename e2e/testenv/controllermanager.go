package main

import (
	"context"
	"fmt"

	"github.com/spf13/pflag"
	"k8s.io/client-go/rest"
	kcm "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
)

// startControllerManager runs kube-controller-manager in this process with
// only the controllers whose absence tests would notice: namespace (deleting
// a namespace empties and removes it), garbagecollector (ownerReferences
// cascade) and serviceaccount (every namespace's "default" account, which the
// ServiceAccount admission plugin wants before it admits a pod there). kubeconfig points straight at the API server, not the proxy, so
// an API blackout does not stall these controllers.
func startControllerManager(ctx context.Context, kubeconfig string) (*task, error) {
	s, err := options.NewKubeControllerManagerOptions()
	if err != nil {
		return nil, err
	}
	fs := pflag.NewFlagSet("kube-controller-manager", pflag.ContinueOnError)
	named := s.Flags(kcm.KnownControllers(), kcm.ControllersDisabledByDefault(), kcm.ControllerAliases())
	s.ParsedFlags = &named
	for _, f := range named.FlagSets {
		fs.AddFlagSet(f)
	}
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--controllers=namespace,garbagecollector,serviceaccount",
		"--leader-elect=false",
		// No metrics/healthz endpoint: nothing scrapes it and it would be
		// one more port to leave behind.
		"--secure-port=0",
		"--use-service-account-credentials=false",
	}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("kube-controller-manager flags: %w", err)
	}
	if err := s.ComponentGlobalsRegistry.Set(); err != nil {
		return nil, err
	}
	rest.SetDefaultWarningHandler(rest.NoWarnings{})
	c, err := s.Config(ctx, kcm.KnownControllers(), kcm.ControllersDisabledByDefault(), kcm.ControllerAliases())
	if err != nil {
		return nil, fmt.Errorf("kube-controller-manager config: %w", err)
	}
	return goTask(func() error { return kcm.Run(ctx, c.Complete()) }), nil
}
