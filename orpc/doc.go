// Package orpc is Tandem's binary RPC over QUIC: unary and server-streaming calls, one stream per call, mutual TLS.
// The wire format, the codec and the join protocol are specified in docs/orpc.md.
package orpc
