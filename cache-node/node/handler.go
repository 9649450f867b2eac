package node

import (
	"context"

	"github.com/larderdb/larder/cache-node/protocol"
)

// Handler serves the node over the cache-node protocol.
func (n *Node) Handler() protocol.Handler { return handler{n} }

type handler struct{ n *Node }

func (h handler) Lookup(ctx context.Context, q protocol.LookupRequest) (protocol.LookupResponse, error) {
	return h.n.lookupWait(ctx, q)
}

func (h handler) Put(ctx context.Context, p protocol.PutRequest) error {
	return h.n.Put(ctx, PutRequest{Key: p.Key, Snapshot: p.Snapshot, Deps: p.Deps, Value: p.Value, Template: p.Template})
}

func (h handler) Stats(ctx context.Context) (protocol.StatsResponse, error) {
	st, err := h.n.cfg.Backend.Stats(ctx)
	if err != nil {
		return protocol.StatsResponse{}, err
	}
	return protocol.StatsResponse{Watermark: h.n.Watermark(), Keys: st.Keys, Versions: st.Versions, Bytes: st.Bytes, Budget: st.Budget, Evictions: st.Evictions}, nil
}
