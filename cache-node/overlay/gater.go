package overlay

import (
	"github.com/libp2p/go-libp2p/core/control"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// allowListGater admits connections only with the peers of an allow-list:
// an outbound dial to any other peer is not attempted, and a connection
// from or to any other peer is closed as soon as its security handshake
// has authenticated the peer's ID, before any stream is opened on it. A
// refused peer therefore cannot route, put or read. A nil allow-list
// admits every peer (Config.Insecure).
type allowListGater struct {
	allow   map[peer.ID]struct{} // nil: every peer
	refused func(dir network.Direction, p peer.ID)
}

func newAllowListGater(ids []peer.ID, refused func(network.Direction, peer.ID)) *allowListGater {
	g := &allowListGater{refused: refused}
	if ids != nil {
		g.allow = make(map[peer.ID]struct{}, len(ids))
		for _, id := range ids {
			g.allow[id] = struct{}{}
		}
	}
	return g
}

func (g *allowListGater) allowed(p peer.ID) bool {
	if g.allow == nil {
		return true
	}
	_, ok := g.allow[p]
	return ok
}

// InterceptPeerDial refuses to dial a peer that is not on the list.
func (g *allowListGater) InterceptPeerDial(p peer.ID) bool {
	if g.allowed(p) {
		return true
	}
	g.refused(network.DirOutbound, p)
	return false
}

// InterceptAddrDial allows every address of an admitted peer.
func (g *allowListGater) InterceptAddrDial(peer.ID, ma.Multiaddr) bool { return true }

// InterceptAccept lets the handshake begin: the peer's ID is not known
// before it (a peer without the network key fails already in the private
// network's handshake).
func (g *allowListGater) InterceptAccept(network.ConnMultiaddrs) bool { return true }

// InterceptSecured closes a connection, either way, with a peer that is
// not on the list once its ID has been authenticated.
func (g *allowListGater) InterceptSecured(dir network.Direction, p peer.ID, _ network.ConnMultiaddrs) bool {
	if g.allowed(p) {
		return true
	}
	g.refused(dir, p)
	return false
}

// InterceptUpgraded allows what InterceptSecured allowed.
func (g *allowListGater) InterceptUpgraded(network.Conn) (bool, control.DisconnectReason) {
	return true, 0
}
