package main

import (
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/pki"
	"github.com/larderdb/larder/internal/servers"
)

// Credentials are what the local stack generates at each start, in
// Dir/secrets (keys mode 0600): a CA, the cache-node's server certificate
// and the clients' certificate (mutual TLS on the cache-node protocol),
// and an nkey per NATS role with that role's subject permissions.
type Credentials struct {
	Dir                   string
	CA, NodeCert, NodeKey string
	ClientCert, ClientKey string
	NATS                  servers.NATSRoles
}

// credentialValidity is how long the generated certificates last.
const credentialValidity = 90 * 24 * time.Hour

func newCredentials(dir, prefix string) (Credentials, error) {
	c := Credentials{Dir: dir}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return c, err
	}
	ca, err := pki.NewCA("Larder local stack CA", credentialValidity)
	if err != nil {
		return c, err
	}
	c.CA = filepath.Join(dir, "ca.pem")
	if err := os.WriteFile(c.CA, ca.PEM, 0o644); err != nil {
		return c, err
	}
	node, err := ca.IssueServer("cache-node", []string{"127.0.0.1", "localhost", "::1"}, credentialValidity)
	if err != nil {
		return c, err
	}
	if c.NodeCert, c.NodeKey, err = node.Write(dir, "cache-node"); err != nil {
		return c, err
	}
	client, err := ca.IssueClient("client", credentialValidity)
	if err != nil {
		return c, err
	}
	if c.ClientCert, c.ClientKey, err = client.Write(dir, "client"); err != nil {
		return c, err
	}
	if c.NATS, err = servers.NewNATSRoles(dir, prefix); err != nil {
		return c, err
	}
	return c, nil
}

// natsOptions are the NATS connection options of a role.
func (c Credentials) natsOptions(role invalidation.Role) ([]nats.Option, error) {
	opt, err := nats.NkeyOptionFromSeed(c.NATS.Seeds[role])
	if err != nil {
		return nil, fmt.Errorf("nkey of %s: %w", role, err)
	}
	return []nats.Option{opt}, nil
}

// clientTLS is the clients' TLS configuration for the cache-node.
func (c Credentials) clientTLS() (*tls.Config, error) {
	return pki.ClientTLS(c.CA, c.ClientCert, c.ClientKey)
}
