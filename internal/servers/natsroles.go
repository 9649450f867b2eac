package servers

import (
	"fmt"
	"path/filepath"

	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/pki"
)

// NATSRoles are generated nkeys for Larder's NATS roles (invalidator,
// cache-node, client) under one subject prefix: Users configures a
// server, Seeds[role] is the seed file a component of that role
// connects with.
type NATSRoles struct {
	Users []NATSUser
	Seeds map[invalidation.Role]string
}

// NewNATSRoles makes a key pair per role, writes each seed to
// dir/<role>.nk (mode 0600) and returns the users with the roles'
// permissions (invalidation.PermissionsFor).
func NewNATSRoles(dir, prefix string) (NATSRoles, error) {
	r := NATSRoles{Seeds: map[invalidation.Role]string{}}
	for _, role := range invalidation.Roles {
		k, err := pki.NewUserNkey()
		if err != nil {
			return r, fmt.Errorf("larder/servers: nkey for %s: %w", role, err)
		}
		path := filepath.Join(dir, string(role)+".nk")
		if err := k.WriteSeed(path); err != nil {
			return r, err
		}
		p := invalidation.PermissionsFor(role, prefix)
		r.Users = append(r.Users, NATSUser{
			Nkey: k.Public, PublishAllow: p.PublishAllow, PublishDeny: p.PublishDeny,
			SubscribeAllow: p.SubscribeAllow, SubscribeDeny: p.SubscribeDeny, AllowResponses: p.AllowResponses,
		})
		r.Seeds[role] = path
	}
	return r, nil
}
