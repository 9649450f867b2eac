package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/secret"
	"github.com/larderdb/larder/invalidator/pincushion"
	"github.com/larderdb/larder/invalidator/publisher"
)

// Options configure the invalidator service.
type Options struct {
	PG          string // PostgreSQL URL of a user that may replicate
	NATS        string // NATS URL
	QUMA        string // QUMA file with the tag column sets; "" for each table's keys
	Slot        string
	Publication string
	Tables      []string // for a new publication; empty: all tables
	Prefix      string   // NATS subject prefix
	Heartbeat   time.Duration
	FixIdentity bool
	// NoDDLTrigger accepts running without the DDL event triggers (see
	// publisher.Config.NoDDLTrigger).
	NoDDLTrigger bool
	StreamMaxAge time.Duration
	StreamMemory bool
	Metrics      string // address of /metrics; "" for none
	// MetricsListener, when set, serves /metrics instead of listening on
	// Metrics (a caller that picked a free port keeps it bound); Run
	// closes it.
	MetricsListener net.Listener
	Pins            bool
	PinInterval     time.Duration
	MaxStaleness    time.Duration
	PinBudget       int
	// NATSOptions are added to the NATS connection's options: the
	// invalidator's credentials (nats.NkeyOptionFromSeed) and TLS.
	NATSOptions []nats.Option
}

// Defaults returns the options the command line starts from.
func Defaults() Options {
	return Options{
		NATS:         nats.DefaultURL,
		Slot:         "larder_invalidator",
		Publication:  "larder_invalidator",
		Prefix:       invalidation.DefaultPrefix,
		Heartbeat:    75 * time.Millisecond,
		StreamMaxAge: time.Hour,
		Metrics:      "127.0.0.1:9188",
		Pins:         true,
		PinInterval:  pincushion.DefaultInterval,
		MaxStaleness: pincushion.DefaultMaxStaleness,
		PinBudget:    pincushion.DefaultBudget,
	}
}

// Validate reports options that cannot work.
func (o *Options) Validate() error {
	if o.PG == "" {
		return fmt.Errorf("%w: a PostgreSQL URL is required", ErrConfig)
	}
	if o.Heartbeat <= 0 || o.PinInterval <= 0 || o.MaxStaleness <= 0 || o.PinBudget < 1 {
		return fmt.Errorf("%w: the heartbeat, pin interval and max staleness must be positive and the pin budget at least 1", ErrConfig)
	}
	if err := invalidation.ValidPrefix(o.Prefix); err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}
	return nil
}

// ErrConfig marks errors that retrying cannot fix.
var ErrConfig = errors.New("configuration")

// IsConfig reports whether err is a configuration error (including a
// replica identity the start-up check refused, DDL event triggers that
// could not be installed, and a missing privilege: to create the
// publication, to replicate).
func IsConfig(err error) bool {
	var ie *publisher.IdentityError
	var te *publisher.DDLTriggerError
	var pe *publisher.PrivilegeError
	return errors.Is(err, ErrConfig) || errors.As(err, &ie) || errors.As(err, &te) || errors.As(err, &pe)
}

// The wait between two replication sessions: a dependency (PostgreSQL,
// NATS) that comes back is used again within maxBackoff.
const (
	minBackoff = 250 * time.Millisecond
	maxBackoff = 2 * time.Second
)

// natsReconnectWait is the pause between two attempts to reconnect to
// NATS.
const natsReconnectWait = 250 * time.Millisecond

// Run runs the publisher (resuming from the slot after any failure) and
// the pincushion until ctx ends.
func Run(ctx context.Context, o Options, log *slog.Logger) error {
	if o.MetricsListener != nil {
		defer o.MetricsListener.Close()
	}
	if err := o.Validate(); err != nil {
		return err
	}
	var sets map[string][][]string
	if o.QUMA != "" {
		var err error
		if sets, err = publisher.ReadTagColumnsFile(o.QUMA); err != nil {
			return fmt.Errorf("%w: %v", ErrConfig, err)
		}
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	restarts := prometheus.NewCounter(prometheus.CounterOpts{Name: "larder_invalidator_restarts_total", Help: "Replication sessions restarted after an error."})
	reg.MustRegister(restarts)

	if ln := o.MetricsListener; ln != nil || o.Metrics != "" {
		if ln == nil {
			var err error
			if ln, err = net.Listen("tcp", o.Metrics); err != nil {
				return fmt.Errorf("%w: metrics listener: %v", ErrConfig, err)
			}
		}
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") })
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
		log.Info("metrics", "addr", "http://"+ln.Addr().String()+"/metrics")
	}

	nc, err := nats.Connect(o.NATS, append([]nats.Option{nats.Name("larder-invalidator"), nats.MaxReconnects(-1), nats.ReconnectBufSize(-1),
		nats.ReconnectWait(natsReconnectWait),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) { log.Warn("NATS disconnected", "err", err) }),
		nats.ReconnectHandler(func(*nats.Conn) { log.Info("NATS reconnected") })}, o.NATSOptions...)...)
	if err != nil {
		return fmt.Errorf("connect to NATS %s: %w", secret.RedactURL(o.NATS), err)
	}
	defer nc.Close()

	commits := pincushion.NewCommitLog(pincushion.DefaultRetain)
	pub, err := publisher.New(publisher.Config{
		ConnString:         o.PG,
		Slot:               o.Slot,
		Publication:        o.Publication,
		Tables:             o.Tables,
		TagColumns:         sets,
		FixReplicaIdentity: o.FixIdentity,
		NoDDLTrigger:       o.NoDDLTrigger,
		NATS:               nc,
		SubjectPrefix:      o.Prefix,
		Heartbeat:          o.Heartbeat,
		StreamMaxAge:       o.StreamMaxAge,
		StreamMemory:       o.StreamMemory,
		Commits:            commits,
		Log:                log,
		Metrics:            reg,
	})
	if err != nil {
		return fmt.Errorf("%w: %v", ErrConfig, err)
	}

	// Clients ask which tables are covered, and which tag column sets are
	// published, before caching anything; they ask again after a notice on
	// SchemaChangedSubject.
	setsSub, err := nc.Subscribe(invalidation.TagSetsSubject(o.Prefix), func(m *nats.Msg) {
		reply := pub.TagSetsReply()
		if reply == nil || m.Reply == "" {
			return // not known yet: the client asks again or keys on tables only
		}
		_ = m.Respond(reply.Marshal())
	})
	if err != nil {
		return fmt.Errorf("subscribe to tag set requests: %w", err)
	}
	defer setsSub.Unsubscribe()
	// Clients (or a deploy step) register the tag column sets their
	// queries key on; one registration at a time.
	regSub, err := nc.Subscribe(invalidation.TagSetsRegisterSubject(o.Prefix), func(m *nats.Msg) {
		if m.Reply == "" {
			return
		}
		var out invalidation.TagSetsRegistered
		req, err := invalidation.DecodeTagSetsRegistration(m.Data)
		if err == nil {
			out, err = pub.Register(ctx, req)
		}
		if err != nil {
			out = invalidation.TagSetsRegistered{Error: err.Error()}
			log.Warn("tag set registration refused", "err", err)
		} else if len(out.Refused) > 0 {
			log.Warn("tag set registration: sets refused", "refused", out.Refused)
		}
		b, _ := json.Marshal(&out)
		_ = m.Respond(b)
	})
	if err != nil {
		return fmt.Errorf("subscribe to tag set registrations: %w", err)
	}
	defer regSub.Unsubscribe()

	// The pincushion runs for as long as Run does: a configuration error
	// that stops the publisher stops it too (a caller that runs Run
	// again, waiting for the fix, would otherwise leave a pincushion and
	// its pins' connections behind at every try).
	cushionCtx, stopCushion := context.WithCancel(ctx)
	cushionDone := make(chan error, 1)
	cushionWaited := false
	defer func() {
		stopCushion()
		if !cushionWaited {
			<-cushionDone
		}
	}()
	if o.Pins {
		cushion, err := pincushion.New(pincushion.Config{
			ConnString:    o.PG,
			NATS:          nc,
			SubjectPrefix: o.Prefix,
			Interval:      o.PinInterval,
			MaxStaleness:  o.MaxStaleness,
			Budget:        o.PinBudget,
			Nudge:         pub.NudgeThrough,
			Log:           log,
			Metrics:       reg,
		}, commits)
		if err != nil {
			cushionWaited = true // none runs
			return fmt.Errorf("%w: %v", ErrConfig, err)
		}
		go func() { cushionDone <- cushion.Run(cushionCtx) }()
	} else {
		cushionDone <- nil
	}

	// The slot's statistics are exported also between sessions.
	watchCtx, stopWatch := context.WithCancel(ctx)
	watchDone := make(chan struct{})
	go func() { pub.WatchSlot(watchCtx); close(watchDone) }()
	defer func() { stopWatch(); <-watchDone }()

	// The publisher resumes from the slot after any failure; only a
	// configuration error (publication, replica identity, DDL triggers)
	// stops the process. The wait before a new session doubles from
	// minBackoff to maxBackoff while sessions fail before their first
	// heartbeat, and starts again from minBackoff after a session that
	// published one (PostgreSQL and NATS both answered).
	backoff := minBackoff
	for {
		err := pub.Run(ctx)
		if ctx.Err() != nil {
			break
		}
		if IsConfig(err) {
			return err
		}
		if pub.Replicated() {
			backoff = minBackoff
		}
		restarts.Inc()
		log.Error("replication session failed; resuming from the slot", "err", err, "in", backoff)
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		if ctx.Err() != nil {
			break
		}
		backoff = min(2*backoff, maxBackoff)
	}
	cushionWaited = true
	if err := <-cushionDone; err != nil {
		return fmt.Errorf("pincushion: %w", err)
	}
	return nil
}
