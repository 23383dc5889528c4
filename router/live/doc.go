// Package live is the running tandem-router around the policy core in package router: the
// registry of workers that dialled in, dispatch, migration, remote prefill, metrics and HTTP.
//
// The routing decision itself (index, cost, admission) stays in router, which imports no
// network code, so that the simulator links it alone; this package adds the I/O and locking.
package live
