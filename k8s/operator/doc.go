// Package operator reconciles TandemClusters into the cluster's Secrets, routers and
// engine pools, and TandemPools into pods placed by gang and topology (tandem-operator).
package operator
