package pipeline

import "crypto/tls"

// ALPN is the protocol a stage link negotiates, so that an ORPC client or anything else
// reaching a stage's port fails its handshake instead of being misread.
const ALPN = "tandem-stage/1"

// linkServerTLS is a cluster identity's server configuration (orpc.Identity.ServerTLS:
// TLS 1.3, a client certificate of the cluster CA required) for stage links.
func linkServerTLS(c *tls.Config) *tls.Config {
	c = c.Clone()
	c.GetConfigForClient = nil // ORPC's picks its join configuration; a link has none
	c.NextProtos = []string{ALPN}
	return c
}

// linkClientTLS is a cluster identity's client configuration (orpc.Identity.ClientTLS:
// the server's certificate verified against the cluster CA) for stage links.
func linkClientTLS(c *tls.Config) *tls.Config {
	c = c.Clone()
	c.NextProtos = []string{ALPN}
	return c
}
