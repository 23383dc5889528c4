// Package pipeline runs one model replica across several processes, one pipeline stage each:
// the stage links (a versioned framed protocol over TCP, mutually authenticated with TLS under
// the cluster CA), the head's forwarder that the engine drives, and the stage server of the others.
package pipeline
