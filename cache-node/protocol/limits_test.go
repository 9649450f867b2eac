package protocol

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"errors"
	"io"
	"log/slog"
	"math/big"
	"net"
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/larderdb/larder/cache-node/store"
)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// start serves s on ln (a fresh TCP listener when nil) until the test ends.
func start(t *testing.T, s *Server, ln net.Listener) string {
	t.Helper()
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	if s.Handler == nil {
		s.Handler = &memHandler{mem: store.NewMemory(1<<26, nil), wm: 1000}
	}
	if s.Log == nil {
		s.Log = quiet
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx, ln) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("serve: %v", err)
		}
	})
	return ln.Addr().String()
}

// eventually waits (generously) for cond.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(30 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

func dial(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// statsRoundTrip sends a stats request on c and reads the answer.
func statsRoundTrip(c net.Conn) error {
	_ = c.SetDeadline(time.Now().Add(20 * time.Second))
	if err := WriteFrame(c, OpStats, nil); err != nil {
		return err
	}
	op, body, _, err := ReadFrame(c, nil, 1<<20)
	if err != nil {
		return err
	}
	if op != OpStats {
		return errors.New("answer: " + string(body))
	}
	return nil
}

// closedByServer reports whether the server closes c (rather than c
// staying open for wait, or an answer arriving).
func closedByServer(c net.Conn, wait time.Duration) error {
	_ = c.SetReadDeadline(time.Now().Add(wait))
	var b [1]byte
	n, err := c.Read(b[:])
	switch {
	case n > 0:
		return errors.New("the server answered")
	case errors.Is(err, io.EOF), errors.Is(err, syscall.ECONNRESET):
		return nil
	case err == nil:
		return errors.New("empty read")
	}
	return err
}

// emfileListener fails its first Accepts with EMFILE, as a process out of
// descriptors does.
type emfileListener struct {
	net.Listener
	fails atomic.Int32
}

func (l *emfileListener) Accept() (net.Conn, error) {
	if l.fails.Add(-1) >= 0 {
		return nil, &net.OpError{Op: "accept", Net: "tcp", Addr: l.Addr(), Err: os.NewSyscallError("accept4", syscall.EMFILE)}
	}
	return l.Listener.Accept()
}

func TestAcceptErrorsBackOff(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := &emfileListener{Listener: inner}
	ln.fails.Store(4)
	s := &Server{}
	began := time.Now()
	addr := start(t, s, ln)
	cl := NewClient(addr, 1)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := cl.Stats(ctx); err != nil {
		t.Fatalf("the server stopped serving after accept errors: %v", err)
	}
	if n := s.Counters().AcceptErrors; n != 4 {
		t.Errorf("accept errors counted: %d, want 4", n)
	}
	// 5 + 10 + 20 + 40 ms of back-off at least.
	if d := time.Since(began); d < 75*time.Millisecond {
		t.Errorf("served after %v: no back-off", d)
	}
}

// Many connections declare the largest frame and send half of it: the
// admitted bytes stay within MaxInFlight, the heap grows by what arrived
// for the admitted frames only, and small requests still pass.
func TestFrameFloodBounded(t *testing.T) {
	const (
		conns    = 16
		maxFrame = 8 << 20
		sent     = maxFrame / 2
		limit    = 24 << 20 // 21 MiB for large frames: two admitted at once
	)
	s := &Server{MaxFrame: maxFrame, MaxInFlight: limit}
	addr := start(t, s, nil)

	var peak atomic.Int64
	stop := make(chan struct{})
	sampled := make(chan struct{})
	go func() {
		defer close(sampled)
		for {
			if v := s.Counters().InFlightBytes; v > peak.Load() {
				peak.Store(v)
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond):
			}
		}
	}()

	runtime.GC()
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	var wg sync.WaitGroup
	for i := 0; i < conns; i++ {
		c := dial(t, addr)
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := make([]byte, 4+sent)
			binary.BigEndian.PutUint32(b, maxFrame)
			b[4], b[5] = Version, OpPut
			if _, err := c.Write(b); err != nil {
				t.Errorf("write: %v", err)
			}
		}()
	}
	wg.Wait()
	eventually(t, "frames beyond the in-flight limit refused", func() bool { return s.Counters().FramesBusy == conns-2 })
	// The frames under way are not in the way of small requests.
	if err := statsRoundTrip(dial(t, addr)); err != nil {
		t.Fatalf("stats during the flood: %v", err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	close(stop)
	<-sampled

	grew := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	t.Logf("%d connections × %d MiB of %d MiB frames: heap alloc +%.1f MiB, in use +%.1f MiB, in flight at most %d MiB, refused %d",
		conns, sent>>20, maxFrame>>20, float64(grew)/(1<<20), (float64(after.HeapInuse)-float64(before.HeapInuse))/(1<<20), peak.Load()>>20, s.Counters().FramesBusy)
	if p := peak.Load(); p > limit {
		t.Errorf("in-flight bytes reached %d, over the limit %d", p, limit)
	}
	// Two admitted frames hold at most 2 × 8 MiB; allocating every declared
	// frame would take 128 MiB.
	if grew > 48<<20 {
		t.Errorf("the heap grew by %d MiB under a flood of unfinished frames", grew>>20)
	}
}

func TestReadFrameGrowsWithInput(t *testing.T) {
	b := make([]byte, 4+100<<10)
	binary.BigEndian.PutUint32(b, 64<<20)
	b[4] = Version
	_, _, buf, err := ReadFrame(bytes.NewReader(b), nil, DefaultMaxFrame)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("a frame cut short: %v", err)
	}
	if cap(buf) > 256<<10 {
		t.Errorf("100 KiB of a 64 MiB frame allocated %d KiB", cap(buf)>>10)
	}
}

// A connection without requests is closed after IdleTimeout; one that
// keeps asking is not.
func TestIdleTimeout(t *testing.T) {
	s := &Server{IdleTimeout: time.Second}
	addr := start(t, s, nil)
	idle := dial(t, addr)
	busy := dial(t, addr)
	for i := 0; i < 40; i++ { // 2 s: twice the idle timeout
		if err := statsRoundTrip(busy); err != nil {
			t.Fatalf("request %d on a busy connection: %v", i, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	busy.Close()
	if err := closedByServer(idle, 20*time.Second); err != nil {
		t.Fatalf("idle connection not closed: %v", err)
	}
	eventually(t, "an idle timeout counted", func() bool { return s.Counters().IdleTimeouts == 1 })
	if st := s.Counters(); st.ReadTimeouts != 0 || st.WriteTimeouts != 0 {
		t.Errorf("counters: %+v", st)
	}
}

// Slowloris: a frame trickled a byte at a time is cut off after ReadTimeout.
func TestReadTimeoutSlowloris(t *testing.T) {
	s := &Server{ReadTimeout: 300 * time.Millisecond, IdleTimeout: time.Minute}
	addr := start(t, s, nil)
	c := dial(t, addr)
	var frame bytes.Buffer
	_ = WriteFrame(&frame, OpLookup, AppendLookup(nil, &LookupRequest{Key: bytes.Repeat([]byte("k"), 200), TMin: 1, TMax: 2}))
	go func() {
		for _, b := range frame.Bytes() { // 4 s at least
			if _, err := c.Write([]byte{b}); err != nil {
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	if err := closedByServer(c, 10*time.Second); err != nil {
		t.Fatalf("slow connection not closed: %v", err)
	}
	eventually(t, "a read timeout counted", func() bool { return s.Counters().ReadTimeouts == 1 })
}

// An answer the peer does not read is cut off after WriteTimeout.
func TestWriteTimeout(t *testing.T) {
	s := &Server{WriteTimeout: 300 * time.Millisecond}
	addr := start(t, s, nil)
	cl := NewClient(addr, 1)
	defer cl.Close()
	if err := cl.Put(context.Background(), &PutRequest{Key: []byte("big"), Snapshot: 1, Value: make([]byte, 1<<20)}); err != nil {
		t.Fatal(err)
	}
	c := dial(t, addr)
	req := AppendLookup(nil, &LookupRequest{Key: []byte("big"), TMin: 1, TMax: 1})
	go func() { // requests, never reading an answer
		for {
			if err := WriteFrame(c, OpLookup, req); err != nil {
				return
			}
		}
	}()
	eventually(t, "a write timeout counted", func() bool { return s.Counters().WriteTimeouts == 1 })
}

// The (MaxConns+1)-th connection is closed at once; the others are served.
func TestMaxConns(t *testing.T) {
	s := &Server{MaxConns: 3}
	addr := start(t, s, nil)
	var held []net.Conn
	for i := 0; i < 3; i++ {
		c := dial(t, addr)
		if err := statsRoundTrip(c); err != nil {
			t.Fatal(err)
		}
		held = append(held, c)
	}
	if err := closedByServer(dial(t, addr), 10*time.Second); err != nil {
		t.Fatalf("connection beyond MaxConns: %v", err)
	}
	for i, c := range held {
		if err := statsRoundTrip(c); err != nil {
			t.Fatalf("connection %d after the refusal: %v", i, err)
		}
	}
	if st := s.Counters(); st.RefusedConns != 1 || st.OpenConns != 3 || st.AcceptedConns != 3 {
		t.Errorf("counters: %+v", st)
	}
	held[0].Close()
	eventually(t, "a closed connection no longer counted", func() bool { return s.Counters().OpenConns == 2 })
	if err := statsRoundTrip(dial(t, addr)); err != nil {
		t.Fatalf("a connection under the limit again: %v", err)
	}
}

func selfSigned(t *testing.T) (tls.Certificate, *x509.CertPool) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "node"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, pool
}

// Over TLS the server works, a peer that never completes the handshake is
// cut off after ReadTimeout (not IdleTimeout), and a peer that is not
// TLS is counted as a failed handshake.
func TestTLSHandshakeBounded(t *testing.T) {
	cert, pool := selfSigned(t)
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	// Long enough for a handshake under the race detector on a busy machine.
	s := &Server{ReadTimeout: 3 * time.Second, IdleTimeout: time.Minute}
	addr := start(t, s, tls.NewListener(inner, &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS13}))

	cl := NewTLSClient(addr, 1, &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS13})
	defer cl.Close()
	if _, err := cl.Stats(context.Background()); err != nil {
		t.Fatalf("stats over TLS: %v", err)
	}

	if err := closedByServer(dial(t, addr), 10*time.Second); err != nil {
		t.Fatalf("silent peer not cut off during the handshake: %v", err)
	}
	eventually(t, "a handshake timeout counted", func() bool { return s.Counters().HandshakeTimeouts == 1 })

	plain := dial(t, addr)
	if err := WriteFrame(plain, OpStats, nil); err != nil {
		t.Fatal(err)
	}
	_, _, _, _ = ReadFrame(plain, nil, 1<<20)
	eventually(t, "a failed handshake counted", func() bool { return s.Counters().HandshakeFailures == 1 })
	if _, err := cl.Stats(context.Background()); err != nil {
		t.Fatalf("stats over TLS afterwards: %v", err)
	}
}

// Malformed and oversized frames are counted; the collector exports
// every figure.
func TestCollector(t *testing.T) {
	s := &Server{MaxConns: 1, MaxFrame: 1 << 20}
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Collector()) // before Serve, as the daemon does
	addr := start(t, s, nil)
	for _, frame := range [][]byte{{0x7f, 0xff, 0xff, 0xff}, {0, 0, 0, 2, Version, 42}} {
		c := dial(t, addr)
		if _, err := c.Write(frame); err != nil {
			t.Fatal(err)
		}
		if err := closedAfterAnswer(c); err != nil {
			t.Fatal(err)
		}
		eventually(t, "the connection released", func() bool { return s.Counters().OpenConns == 0 })
	}
	held := dial(t, addr)
	if err := statsRoundTrip(held); err != nil {
		t.Fatal(err)
	}
	if err := closedByServer(dial(t, addr), 10*time.Second); err != nil {
		t.Fatal(err)
	}

	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range fams {
		for _, m := range f.GetMetric() {
			name := f.GetName()
			for _, l := range m.GetLabel() {
				name += "{" + l.GetValue() + "}"
			}
			switch {
			case m.GetCounter() != nil:
				got[name] = m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				got[name] = m.GetGauge().GetValue()
			}
		}
	}
	want := map[string]float64{
		"larder_node_conns_open": 1, "larder_node_conns_limit": 1, "larder_node_conns_accepted_total": 3,
		"larder_node_conns_refused_total": 1, "larder_node_accept_errors_total": 0,
		"larder_node_tls_handshake_failures_total": 0,
		"larder_node_conn_timeouts_total{idle}":    0, "larder_node_conn_timeouts_total{read}": 0, "larder_node_conn_timeouts_total{write}": 0,
		"larder_node_frames_refused_total{too_large}": 1, "larder_node_frames_refused_total{malformed}": 1,
		"larder_node_frames_refused_total{in_flight}": 0,
		"larder_node_in_flight_bytes":                 0, "larder_node_in_flight_limit_bytes": DefaultMaxInFlight,
	}
	for name, v := range want {
		if g, ok := got[name]; !ok || g != v {
			t.Errorf("%s = %v (exported: %v), want %v", name, g, ok, v)
		}
	}
	if len(got) != len(want) {
		t.Errorf("exported %d series, want %d: %v", len(got), len(want), got)
	}
}

// closedAfterAnswer: an error answer, then the end of the connection.
func closedAfterAnswer(c net.Conn) error {
	_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
	op, _, _, err := ReadFrame(c, nil, 1<<20)
	if err != nil || op != OpError {
		return errors.New("no error answer")
	}
	return closedByServer(c, 20*time.Second)
}
