// Package daemon runs a cache-node: the NATS connection, the store
// (memory or Redis), the node, the protocol server and the metrics
// endpoint. The cache-node command and the local stack (deploy/local) both
// use it.
package daemon
