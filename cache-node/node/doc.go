// Package node is a cache-node's reasoning about time: it follows the
// invalidator's stream on NATS, keeps the watermark (the LSN up to which it
// knows every invalidation of its groups), subscribes to a tag's group when
// the first version holding it arrives and leaves it when the last one
// closes (Ferdinand), and decides each put's validity interval so that no
// version is ever served past an invalidation.
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
// A possible gap (a reconnect, a queue about to overflow, an undecodable
// message) ends every open version at the watermark + 1 and forgets every
// group: the node then loses hit rate, never correctness.
package node
