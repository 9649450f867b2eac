package overlay

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/pnet"
)

// maxSecretFile bounds what is read of a key, PSK or allow-list file.
const maxSecretFile = 1 << 20

// LoadOrCreateIdentity returns the node's Ed25519 identity kept in path
// (libp2p's protobuf encoding of the private key). On first start the file
// does not exist: a new key is written there with mode 0600 (never over an
// existing file). A file that group or others may read or write, that is
// not a libp2p private key, or whose key is not Ed25519 is an error: the
// node's peer ID is what the other members admit it by.
func LoadOrCreateIdentity(path string) (crypto.PrivKey, error) {
	if path == "" {
		return nil, errors.New("identity: no key file")
	}
	b, err := readPrivateFile(path, "identity key")
	if errors.Is(err, fs.ErrNotExist) {
		return createIdentity(path)
	}
	if err != nil {
		return nil, err
	}
	k, err := crypto.UnmarshalPrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("identity key %s is corrupt (not a libp2p private key: %v); remove it to make a new identity, which the other members must then admit", path, err)
	}
	if k.Type() != crypto.Ed25519 {
		return nil, fmt.Errorf("identity key %s holds a %s key; want Ed25519", path, k.Type())
	}
	return k, nil
}

// createIdentity writes a new Ed25519 key to path: to a temporary file
// first, then linked into place, so that a crash leaves no half-written
// key and a concurrent start cannot overwrite one.
func createIdentity(path string) (crypto.PrivKey, error) {
	k, _, err := crypto.GenerateEd25519Key(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	b, err := crypto.MarshalPrivateKey(k)
	if err != nil {
		return nil, fmt.Errorf("identity: %w", err)
	}
	if err := writeNewPrivateFile(path, b); err != nil {
		if errors.Is(err, fs.ErrExist) {
			return LoadOrCreateIdentity(path) // made meanwhile by another start
		}
		return nil, fmt.Errorf("identity key %s: %w", path, err)
	}
	return k, nil
}

// writeNewPrivateFile writes b to a new file at path, mode 0600; an
// existing file is fs.ErrExist.
func writeNewPrivateFile(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Link(tmp, path)
}

// readPrivateFile reads a secret file, refusing one that group or others
// may access (as ssh does): such a secret may already be known to others.
func readPrivateFile(path, what string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() {
		return nil, fmt.Errorf("%s %s is not a regular file", what, path)
	}
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("%s %s may be accessed by group or others (mode %04o): chmod 600 it", what, path, perm)
	}
	b, err := io.ReadAll(io.LimitReader(f, maxSecretFile+1))
	if err != nil {
		return nil, fmt.Errorf("%s %s: %w", what, path, err)
	}
	if len(b) > maxSecretFile {
		return nil, fmt.Errorf("%s %s is larger than %d bytes", what, path, maxSecretFile)
	}
	return b, nil
}

// ReadPSK reads a libp2p pre-shared network key in the standard format
// (the first line /key/swarm/psk/1.0.0/, then /base16/, /base64/ or /bin/,
// then 32 bytes in that encoding), as the file that go-ipfs and other
// libp2p programs call swarm.key. Like the identity key, the file must
// not be accessible to group or others.
func ReadPSK(path string) (pnet.PSK, error) {
	b, err := readPrivateFile(path, "pre-shared network key")
	if err != nil {
		return nil, err
	}
	psk, err := pnet.DecodeV1PSK(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("pre-shared network key %s: %w (want /key/swarm/psk/1.0.0/, /base16/ and 64 hex digits, one a line)", path, err)
	}
	return psk, nil
}

// WritePSK writes a new random pre-shared network key to path (mode
// 0600, base16) and returns it; an existing file is not overwritten.
func WritePSK(path string) (pnet.PSK, error) {
	psk := make(pnet.PSK, 32)
	if _, err := rand.Read(psk); err != nil {
		return nil, err
	}
	text := "/key/swarm/psk/1.0.0/\n/base16/\n" + hex.EncodeToString(psk) + "\n"
	if err := writeNewPrivateFile(path, []byte(text)); err != nil {
		return nil, fmt.Errorf("pre-shared network key %s: %w", path, err)
	}
	return psk, nil
}

// ReadAllowList reads the peer IDs admitted to the overlay: one a line;
// blank lines and lines starting with # are ignored, and so is anything
// after the ID on a line. A file that names no peer is an error (it would
// admit no one, which is never what is meant).
func ReadAllowList(path string) ([]peer.ID, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("allow-list: %w", err)
	}
	defer f.Close()
	var ids []peer.ID
	sc := bufio.NewScanner(f)
	for line := 1; sc.Scan(); line++ {
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		field := strings.Fields(text)[0]
		id, err := peer.Decode(field)
		if err != nil {
			return nil, fmt.Errorf("allow-list %s:%d: %q is not a peer ID: %v", path, line, field, err)
		}
		ids = append(ids, id)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("allow-list %s: %w", path, err)
	}
	if len(ids) == 0 {
		return nil, fmt.Errorf("allow-list %s names no peer", path)
	}
	return ids, nil
}
