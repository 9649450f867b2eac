package main

import (
	"context"
	"fmt"
	"time"

	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/cache-node/store"
)

// OverlayDemo is what the smoke check saw of the overlay (two nodes or
// more): a key the second node masters, put and read by a client of the
// first node, its home node, which forwarded both to the master.
type OverlayDemo struct {
	Key              string
	Home, Master     string // peer IDs
	HomeAddr         string // the home node's protocol address
	MasterAddr       string
	Value            string // what the client read through the home node
	HomeKeys         [2]int64
	MasterKeys       [2]int64 // keys held before and after the put
	ServedByMaster   bool     // a lookup at the master itself hits
	MembersSeenByOne int      // live members as the home node sees them
}

// overlayRoundTrip puts a value of a key the second node masters through
// the first node, reads it back through the first, and checks that the
// master holds it and the first node does not.
func (s *Stack) overlayRoundTrip(ctx context.Context, r *SmokeReport) error {
	if len(s.nodes) < 2 || s.nodes[0].ov == nil || s.nodes[1].ov == nil {
		return nil
	}
	home, master := s.nodes[0], s.nodes[1]
	d := &OverlayDemo{Home: home.ov.ID().String(), Master: master.ov.ID().String(), HomeAddr: home.addr, MasterAddr: master.addr,
		MembersSeenByOne: len(home.ov.Members())}
	// A key whose master is the second node, as both nodes see it.
	for i := 0; d.Key == ""; i++ {
		k := fmt.Sprintf("larder-demo-overlay-%d", i)
		if home.ov.Master([]byte(k)) == master.ov.ID() && master.ov.Master([]byte(k)) == master.ov.ID() {
			d.Key = k
		}
	}
	tlsCfg, err := s.Creds.clientTLS()
	if err != nil {
		return err
	}
	homeCl := protocol.NewTLSClient(home.addr, 1, tlsCfg)
	defer homeCl.Close()
	masterCl := protocol.NewTLSClient(master.addr, 1, tlsCfg)
	defer masterCl.Close()
	keys := func(i int) error {
		hs, err := homeCl.Stats(ctx)
		if err != nil {
			return fmt.Errorf("smoke: overlay: home node stats: %w", err)
		}
		ms, err := masterCl.Stats(ctx)
		if err != nil {
			return fmt.Errorf("smoke: overlay: master stats: %w", err)
		}
		d.HomeKeys[i], d.MasterKeys[i] = hs.Keys, ms.Keys
		return nil
	}
	if err := keys(0); err != nil {
		return err
	}
	pin := r.Pins[len(r.Pins)-1]
	dep := store.Dep{Tag: "public.larder_demo", Table: "public.larder_demo"}
	value := "count(*) = " + r.CachedCount
	if err := homeCl.Put(ctx, &protocol.PutRequest{Key: []byte(d.Key), Snapshot: pin.LSN, Deps: []store.Dep{dep}, Value: []byte(value)}); err != nil {
		return fmt.Errorf("smoke: overlay: put through the home node: %w", err)
	}
	// The put is served once the master confirmed the table's group.
	for {
		res, err := homeCl.Lookup(ctx, &protocol.LookupRequest{Key: []byte(d.Key), TMin: pin.LSN, TMax: pin.LSN})
		if err != nil {
			return fmt.Errorf("smoke: overlay: lookup through the home node: %w", err)
		}
		if res.Miss == store.Hit {
			d.Value = string(res.Value)
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("smoke: overlay: the key was never served through the home node: %w", ctx.Err())
		}
		time.Sleep(10 * time.Millisecond)
	}
	res, err := masterCl.Lookup(ctx, &protocol.LookupRequest{Key: []byte(d.Key), TMin: pin.LSN, TMax: pin.LSN})
	if err != nil {
		return fmt.Errorf("smoke: overlay: lookup at the master: %w", err)
	}
	d.ServedByMaster = res.Miss == store.Hit && string(res.Value) == d.Value
	if err := keys(1); err != nil {
		return err
	}
	if !d.ServedByMaster || d.MasterKeys[1] != d.MasterKeys[0]+1 || d.HomeKeys[1] != d.HomeKeys[0] {
		return fmt.Errorf("smoke: overlay: key %s should be held by its master only: served by the master %v, keys held by the master %d → %d, by the home node %d → %d",
			d.Key, d.ServedByMaster, d.MasterKeys[0], d.MasterKeys[1], d.HomeKeys[0], d.HomeKeys[1])
	}
	r.Overlay = d
	return nil
}
