// Command cache-node is Larder's cache daemon: it holds versioned query
// results with validity intervals (package store: in memory, or in a Redis
// it fronts), follows the invalidation groups of what it holds over NATS
// (package node), and serves lookups and puts over a lean binary protocol
// (package protocol).
//
//	cache-node --listen 127.0.0.1:7070 --nats nats://… --nats-nkey node.nk \
//	  --tls-cert node.pem --tls-key node-key.pem --tls-client-ca ca.pem --store memory --memory 256MiB
//
// The protocol is served over mutual TLS: a peer without a certificate
// signed by --tls-client-ca is refused at the handshake. Plain TCP only
// with --insecure-no-auth.
package main
