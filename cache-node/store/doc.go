// Package store holds a cache-node's versioned results: for each key,
// several versions, each valid for an interval [Lo, Hi) of commit-LSN
// timestamps. Backend is the small interface every backend implements —
// Memory here (the embedded default), Redis in package redisstore — with
// the same answers, which package storetest checks.
//
// A backend stores the intervals the node decides and applies
// invalidations mechanically; the reasoning about which intervals are
// provable (watermarks, subscriptions, the race between a put and an
// invalidation) lives in package node.
package store
