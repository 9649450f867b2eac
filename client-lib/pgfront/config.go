package pgfront

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	larder "github.com/larderdb/larder/client-lib"
)

// Config configures a Front.
type Config struct {
	// Listen is the address clients connect to ("127.0.0.1:6432"; port 0
	// picks one, see Front.Addr).
	Listen string
	// Postgres is PostgreSQL's host:port. Each client session gets its own
	// connection to it, authenticated with the client's own credentials.
	Postgres string
	// Client is the library the front answers Larder read-only
	// transactions through. The front does not close it.
	Client *larder.Client
	// DefaultStaleness is larder.staleness until a session sets it.
	DefaultStaleness time.Duration
	// TLS, when set, is offered to clients that ask for it (SSLRequest);
	// without it the front answers 'N' and clients may go on in clear.
	TLS *tls.Config
	// PostgresTLS, when set, is used on every connection to PostgreSQL.
	PostgresTLS *tls.Config
	// DialTimeout bounds connecting to PostgreSQL (TLS included).
	DialTimeout time.Duration
	// MaxMessageBytes is the largest message a client may send; a larger
	// one ends its session.
	MaxMessageBytes int
	// Descriptions is how many statement descriptions (what a Parse
	// inside a Larder transaction answers without asking PostgreSQL) the
	// front keeps, across sessions, by session state and text.
	Descriptions int
	Log          *slog.Logger
	Metrics      prometheus.Registerer // may be nil
}

// DefaultConfig returns the defaults; Listen, Postgres and Client are left
// to the caller.
func DefaultConfig() Config {
	return Config{
		// The library's own default: a read may be up to 30 s old.
		DefaultStaleness: 30 * time.Second,
		// Connecting to PostgreSQL on the same machine takes milliseconds;
		// one that does not answer in 10 s is down.
		DialTimeout: 10 * time.Second,
		// PostgreSQL accepts messages up to 1 GiB; 64 MiB bounds what one
		// client can make the front hold while staying far above what
		// applications send (COPY sends 64 KiB pieces).
		MaxMessageBytes: 64 << 20,
		// A few hundred bytes each: 4096 statements of a few hundred
		// texts per role and setting are a few megabytes.
		Descriptions: 4096,
	}
}

// Validate reports a configuration that cannot work.
func (c *Config) Validate() error {
	if c.Client == nil {
		return errors.New("pgfront: Config.Client is required")
	}
	if _, _, err := net.SplitHostPort(c.Postgres); err != nil {
		return fmt.Errorf("pgfront: Config.Postgres %q: want host:port", c.Postgres)
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("pgfront: Config.Listen %q: want host:port", c.Listen)
	}
	if c.DefaultStaleness <= 0 || c.DefaultStaleness > larder.MaxStaleness {
		return fmt.Errorf("pgfront: Config.DefaultStaleness %s: want a positive duration of at most %s", c.DefaultStaleness, larder.MaxStaleness)
	}
	if c.DialTimeout <= 0 {
		return errors.New("pgfront: Config.DialTimeout must be positive")
	}
	if c.MaxMessageBytes < 1<<20 {
		return errors.New("pgfront: Config.MaxMessageBytes must be at least 1 MiB")
	}
	if c.Descriptions < 1 {
		return errors.New("pgfront: Config.Descriptions must be positive")
	}
	return nil
}
