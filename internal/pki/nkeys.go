package pki

import (
	"fmt"
	"os"

	"github.com/nats-io/nkeys"
)

// UserNkey is a NATS user's key pair: the server is configured with
// Public, the user connects with the seed (nats.NkeyOptionFromSeed).
type UserNkey struct {
	Public string
	Seed   []byte
}

// NewUserNkey makes a NATS user key pair.
func NewUserNkey() (UserNkey, error) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		return UserNkey{}, err
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return UserNkey{}, err
	}
	seed, err := kp.Seed()
	if err != nil {
		return UserNkey{}, err
	}
	return UserNkey{Public: pub, Seed: seed}, nil
}

// WriteSeed writes the seed to path with mode 0600.
func (k UserNkey) WriteSeed(path string) error {
	if err := os.WriteFile(path, append(append([]byte(nil), k.Seed...), '\n'), 0o600); err != nil {
		return fmt.Errorf("pki: nkey seed: %w", err)
	}
	return nil
}
