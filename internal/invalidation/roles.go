package invalidation

// Role is what a NATS user of Larder may do. NATS enforces it with
// per-user subject permissions (see Permissions): only the invalidator
// may publish invalidations, heartbeats, schema notices and pins, and
// answer the pin and tag-set requests; cache-nodes read the invalidation
// stream; clients subscribe, ask, and read the stream too (their L1s
// follow it).
type Role string

// The roles.
const (
	RoleInvalidator Role = "invalidator"
	RoleCacheNode   Role = "cache-node"
	RoleClient      Role = "client"
	// RoleLeaf is a leaf node's connection to the hub: an edge site's
	// NATS server, whose own users are the edge's cache-nodes and
	// clients. Its permissions bound what crosses the leaf connection, as
	// seen from the leaf: what it may publish into the hub and what the
	// hub may deliver to it.
	RoleLeaf Role = "leaf"
)

// Roles lists every role.
var Roles = []Role{RoleInvalidator, RoleCacheNode, RoleClient, RoleLeaf}

// Permissions are a role's NATS subject permissions: the allow and deny
// lists of publish and subscribe, and whether the user may answer
// requests sent to it (NATS's allow_responses).
type Permissions struct {
	PublishAllow, PublishDeny     []string
	SubscribeAllow, SubscribeDeny []string
	AllowResponses                bool
}

// requests are the subjects clients publish to and only the invalidator
// reads: requests it answers, and the clients' staleness demands.
func requests(prefix string) []string {
	return []string{PinVerifySubject(prefix), PinListSubject(prefix), TagSetsSubject(prefix), TagSetsRegisterSubject(prefix), PinHorizonSubject(prefix)}
}

// streamReads are the JetStream API subjects that read the invalidation
// stream (its info, an ordered consumer, single messages and direct gets)
// and change nothing.
func streamReads(stream string) []string {
	return []string{
		"$JS.API.INFO",
		"$JS.API.STREAM.INFO." + stream,
		"$JS.API.STREAM.MSG.GET." + stream,
		"$JS.API.DIRECT.GET." + stream,
		"$JS.API.DIRECT.GET." + stream + ".>",
		"$JS.API.CONSUMER.CREATE." + stream,
		"$JS.API.CONSUMER.CREATE." + stream + ".>",
		"$JS.API.CONSUMER.INFO." + stream + ".>",
		"$JS.API.CONSUMER.MSG.NEXT." + stream + ".>",
		"$JS.API.CONSUMER.DELETE." + stream + ".>",
	}
}

// PermissionsFor returns the permissions of role under prefix.
//
// The invalidator publishes everything under the prefix, manages its
// JetStream stream and answers requests. A cache-node publishes nothing
// under the prefix: it only reads the stream (stream info, an ordered
// consumer and single messages, all on the JetStream API of that one
// stream) and subscribes. A client publishes the requests (pin verify,
// pin list, tag sets, tag set registrations), reads the stream as a
// cache-node does (its L1 follows it) and subscribes. Neither may publish to an
// inbox, so neither can forge an answer to another's request, and
// neither may subscribe to the request subjects.
func PermissionsFor(role Role, prefix string) Permissions {
	stream := StreamName(prefix)
	switch role {
	case RoleInvalidator:
		return Permissions{
			PublishAllow:   []string{prefix + ".>", "$JS.API.>", "$KV." + TagSetsBucket(prefix) + ".>"},
			SubscribeAllow: []string{prefix + ".>", "_INBOX.>"},
			AllowResponses: true,
		}
	case RoleCacheNode:
		return Permissions{
			PublishAllow:   streamReads(stream),
			SubscribeAllow: []string{prefix + ".>", "_INBOX.>"},
			SubscribeDeny:  requests(prefix),
		}
	case RoleClient:
		return Permissions{
			PublishAllow:   append(requests(prefix), streamReads(stream)...),
			SubscribeAllow: []string{prefix + ".>", "_INBOX.>"},
			SubscribeDeny:  requests(prefix),
		}
	case RoleLeaf:
		// What the edge's cache-nodes and clients may do, together: the
		// clients' requests and the cache-nodes' reads of the stream go up,
		// the prefix's messages and the answers come down. Nothing at the
		// edge publishes under the prefix or into an inbox (an answer), so
		// an edge can forge no invalidation, pin or answer at the hub.
		client, node := PermissionsFor(RoleClient, prefix), PermissionsFor(RoleCacheNode, prefix)
		return Permissions{
			PublishAllow:   append(append([]string{}, client.PublishAllow...), node.PublishAllow...),
			SubscribeAllow: []string{prefix + ".>", "_INBOX.>"},
			SubscribeDeny:  requests(prefix),
		}
	}
	// An unknown role may do nothing.
	return Permissions{PublishDeny: []string{">"}, SubscribeDeny: []string{">"}}
}
