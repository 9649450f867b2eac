// Command invalidator is the source of truth for time and invalidation in
// Larder. It reads PostgreSQL's logical replication stream, publishes every
// committed transaction's invalidation tags to NATS JetStream in commit
// order with heartbeats (package publisher), and keeps the pincushion of
// exact pinned snapshots, verified against the commits the publisher
// decodes (package pincushion).
//
//	invalidator --pg postgres://… --nats nats://… [--quma quma.json] [flags]
//
// See README.md beside this file for the flags, metrics and the wire format.
package main
