// Package overlay makes cache-nodes members of a libp2p Kademlia DHT and
// places each key on its master: the live member standing at the point of
// the key space closest to the key in the DHT's XOR metric, each member at
// Config.VirtualPositions points derived from its peer ID (32 by default:
// one point each leaves the shares of few members very unequal). A node forwards a lookup or put of a
// key another member masters to that member over a libp2p stream, and
// answers the rest itself.
//
// Identity and admission. Every node has a persistent Ed25519 identity
// (a key file made with mode 0600 on first start; a file that is corrupt,
// not Ed25519, or accessible to group or others is refused). A peer is let
// in only with both:
//   - the private network's pre-shared key (libp2p pnet, the standard
//     /key/swarm/psk/1.0.0/ file): every connection is encrypted with it
//     beneath the security handshake, so a peer without it fails at the
//     first bytes;
//   - its peer ID on the allow-list: a ConnectionGater refuses a dial to,
//     and closes a connection from or to, any other peer as soon as the
//     handshake has authenticated its ID, before a stream is opened.
//
// A refused peer can therefore not route, put or read. Start refuses to
// run without both (ErrUnauthenticated) unless Config.Insecure: an open
// overlay lets anyone who can reach it become the master of keys and serve
// forged results to every member. Only TCP is used (the pre-shared key
// protector does not work on QUIC); no relay.
//
// Membership. The DHT (go-libp2p-kad-dht, server mode, protocol prefix
// /larder, no value or provider records: it only routes) is joined through
// bootstrap peers. The live members are this node and the peers of its
// routing table that it is connected to and that speak PeerProtocol. A
// member whose connection closes (it left, or crashed; yamux's keep-alive
// notices a silent one) stops being live at once, is dialled again every
// LivenessInterval and is live again when a dial succeeds; one unreachable
// for ForgetAfter leaves the routing table. Watch reports every change.
// Members that see the same live set agree on every key's master. In a
// cluster larger than the routing table holds in full (20 peers per
// bucket) members may disagree; correctness does not depend on agreement,
// since every node answers by its own validity rules, only the hit rate
// does.
//
// Peer protocol. PeerProtocol streams carry the cache-node protocol's
// frames (package protocol): requests and their answers, one at a time per
// stream; up to 16 idle streams per member are kept between requests (a
// new stream per request costs several times the request). A member's
// request is answered by the local node and never forwarded further, so
// requests cannot loop. A frame is at most Config.MaxFrame either way; a
// forwarded request has Config.RequestTimeout (2 s) for its answer, a
// served one ServeTimeout; an error of the master comes back as a
// *PeerError naming it, never as a local answer in its place.
//
// Clients do not join the overlay: with client-lib's home placement an
// application server sends every key to one member, its home node, which
// forwards it to the key's master.
//
// Not done. The forwarding node keeps no copy of what the master answers:
// a copy would need the same validity rules as the master's (its groups
// followed, its watermark covering the interval), and a lookup answer does
// not carry the version's tags. Keys do not move on a membership change:
// the new master of a key starts empty for it and misses, which loses hit
// rate, never correctness; the old master's versions age out by LRU.
//
// Metrics (on Config.Registry): larder_overlay_peers,
// _routing_table_peers, _requests_total{op,route} (route local: this node
// masters the key; forwarded; from_peer: served for a member),
// _forward_seconds{op}, _peer_errors_total{op,kind},
// _conns_refused_total{direction}, _membership_changes_total.
package overlay
