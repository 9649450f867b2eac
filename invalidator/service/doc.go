// Package service wires the invalidator together: the NATS connection, the
// publisher (restarted from its slot after any failure other than a
// configuration error, after at most 2 s), the slot's statistics, the
// pincushion fed by the publisher's decoded commits, and the Prometheus
// endpoint. The invalidator command and the local stack (deploy/local)
// both run it.
package service
