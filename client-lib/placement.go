package larder

import (
	"fmt"
	"hash/fnv"
)

// Placement picks the cache-node a key's lookups and puts go to, among
// the client's nodes (Config.Nodes, in their order): groupcache's
// PeerPicker. It only chooses where to ask; every node answers by its own
// validity rules, so a placement can cost hit rate, never consistency.
//
// Node returns the index of the node to ask about key among n nodes, or
// -1 for none; usable(i) reports whether node i's circuit breaker lets
// calls through now (asking it may start the probe of an open breaker
// whose back-off has ended, so a placement that skips a node still lets
// it come back). A Placement is called concurrently.
type Placement interface {
	Node(key []byte, n int, usable func(i int) bool) int
}

// Placement names, as the DSN parameter larder.node-placement takes them.
const (
	PlacementHash = "hash"
	PlacementHome = "home"
)

// HashPlacement spreads keys over the nodes by the FNV-1a hash of the key
// modulo their count: each node holds its share and nodes do not talk to
// each other. A node whose breaker is open is still picked for its keys:
// their reads go to PostgreSQL until it answers again. The default.
func HashPlacement() Placement { return hashPlacement{} }

type hashPlacement struct{}

func (hashPlacement) Node(key []byte, n int, _ func(int) bool) int {
	if n == 0 {
		return -1
	}
	h := fnv.New32a()
	h.Write(key)
	return int(h.Sum32() % uint32(n))
}

// HomePlacement sends every key to the application server's home node,
// the first of the nodes, which is a member of the cache-nodes' overlay
// and forwards each key to its master (the member closest to the key in
// the DHT; cache-node --p2p-*): the client needs no view of the overlay,
// and a node that joins or leaves changes no client's configuration.
// While the home node's breaker is open the next usable node in the list
// serves as home; when none is usable, the home node is picked (the call
// is bypassed: the read goes to PostgreSQL). Use it only with nodes that
// are members of one overlay: without forwarding, each key would be cached
// on whichever node is home, once per application server.
func HomePlacement() Placement { return homePlacement{} }

type homePlacement struct{}

func (homePlacement) Node(_ []byte, n int, usable func(int) bool) int {
	if n == 0 {
		return -1
	}
	for i := 0; i < n; i++ {
		if usable(i) {
			return i
		}
	}
	return 0
}

// ParsePlacement returns the placement a name (PlacementHash,
// PlacementHome) stands for.
func ParsePlacement(name string) (Placement, error) {
	switch name {
	case PlacementHash:
		return HashPlacement(), nil
	case PlacementHome:
		return HomePlacement(), nil
	}
	return nil, fmt.Errorf("unknown placement %q: want %s or %s", name, PlacementHash, PlacementHome)
}

// node is the cache-node a key's requests go to (nil: none configured).
func (c *Client) node(key []byte) *nodeClient {
	p := c.cfg.Placement
	if p == nil {
		p = HashPlacement()
	}
	i := p.Node(key, len(c.nodes), func(i int) bool { return c.nodes[i].available() })
	if i < 0 || i >= len(c.nodes) {
		return nil
	}
	return c.nodes[i]
}
