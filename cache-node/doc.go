// Command cache-node is Larder's cache daemon: it holds versioned query
// results with validity intervals (package store: in memory, or in a Redis
// it fronts), follows the invalidation groups of what it holds over NATS
// (package node), and serves lookups and puts over a lean binary protocol
// (package protocol).
//
//	cache-node --listen 127.0.0.1:7070 --nats nats://… --store memory --memory 256MiB
//	cache-node --listen 127.0.0.1:7070 --nats nats://… --store redis://127.0.0.1:6379/0 --memory 1GiB
package main
