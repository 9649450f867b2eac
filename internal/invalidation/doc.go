// Package invalidation is the wire format of Larder's invalidation stream:
// the messages the invalidator publishes on NATS for every committed
// transaction and every heartbeat, the pins the pincushion announces, and
// the NATS subjects they travel on. Cache-nodes, client-lib's L1 and the
// invalidator all speak it; FORMAT.md beside this file is its reference.
//
// Every message starts with a format version byte; a decoder refuses a
// version it does not know and never panics on corrupt input.
package invalidation
