// Package node is a cache-node's reasoning about time: it follows the
// invalidator's stream on NATS, keeps the watermark (the LSN up to which it
// knows every invalidation of its groups), subscribes to a tag's group when
// the first version holding it arrives and leaves it when the last one
// settles (Ferdinand; a closed version settles once the watermark passes
// its end, since until then a late or replayed message may still shorten
// it), and decides each put's validity interval so that no version is ever
// served past an invalidation.
//
// Two races are closed here. A put computed at snapshot S can arrive after
// an invalidation at L > S of one of its tags: the node keeps the last few
// invalidations per group and ends the version at the first that hits it.
// A put can also be the first of its tag, so the node was not subscribed
// when that invalidation was published: the version waits, unserved, until
// the subscription is proved effective — a heartbeat routed after it, then
// the group's last message in JetStream, every earlier message having been
// acknowledged before that heartbeat was sent.
//
// A possible gap (a queue about to overflow, an undecodable message, a
// failed replay, a backend that refused a write or restarted) ends every
// version, open or closed, at the watermark + 1 at the latest and forgets
// every group: the node then loses hit rate, never correctness.
//
// Load leases (lease.go) collapse concurrent misses of one key across
// clients: a lookup that asks to wait is held while another requester
// loads the key, then answered for its own range. Config.Broadcast is the
// broadcast ablation: every invalidation of the prefix is received, those
// of groups the node does not follow dropped.
package node
