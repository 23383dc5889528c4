// Package deploy holds the Kubernetes manifests (kubectl apply -k deploy/) and the
// dashboards; Go code reads the CRDs and samples from here, so tests hold what users apply.
package deploy

import "embed"

// Files are the kustomization and what it applies, and the sample cluster.
//
//go:embed kustomization.yaml crd/*.yaml operator/*.yaml samples/*.yaml
var Files embed.FS
