package php

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// InstallHint is what installs PHP with its PostgreSQL extensions and
// PHPUnit on Debian.
const InstallHint = "apt-get install -y php-cli php-pgsql phpunit (or: bash deploy/install-deps.sh)"

// Config configures one PHP server running the application.
type Config struct {
	// DSN is the database as libpq reads it (a connection string or a
	// postgresql:// URI without larder.* parameters): the front's address,
	// or PostgreSQL's with Direct.
	DSN string
	// Direct says DSN is plain PostgreSQL: read-only transactions do not
	// set larder.staleness.
	Direct bool
	// Listen is the address to serve on; port 0 (the default
	// "127.0.0.1:0") lets the system choose, see Server.URL.
	Listen string
	// Workers is PHP_CLI_SERVER_WORKERS: processes serving requests at the
	// same time, each with its own persistent database session. 1 (the
	// default) serves one request at a time.
	Workers int
	// Staleness is the limit of read-only pages (default 30 s).
	Staleness time.Duration
	// Clock, when not zero, fixes the application's clock (tests compare
	// pages with the Go application's at one $now).
	Clock time.Time
	// SQLNow runs RUBiS's original end_date >= now() form.
	SQLNow bool
	// Router is router.php (default: found beside this package's source,
	// or bench/rubis/php/router.php under the working directory).
	Router string
	// PHP is the php binary (default: "php" on $PATH).
	PHP string
	// Log receives PHP's standard error: failed interactions, warnings
	// (default: discarded).
	Log io.Writer
	// StartTimeout bounds the wait until the server answers (default 30 s).
	StartTimeout time.Duration
}

// Server is PHP's built-in server running the application. Close it.
type Server struct {
	cmd *exec.Cmd
	// watchdog ends the server's process group when its standard input
	// (the pipe held by guard) closes: when Close closes it, or when this
	// process dies, even by SIGKILL. PHP's workers outlive their parent,
	// whose parent-death signal they do not inherit.
	watchdog *exec.Cmd
	guard    io.WriteCloser
	url      string
	done     chan struct{} // closed when the process has exited
	once     sync.Once
	err      error // the process's exit, valid after done
}

var startedRE = regexp.MustCompile(`Development Server \(http://([^)]+)\) started`)

// Start runs the application under `php -S` and waits until it answers.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.DSN == "" {
		return nil, errors.New("rubis php: Config.DSN is required")
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Workers < 1 {
		cfg.Workers = 1
	}
	if cfg.Staleness <= 0 {
		cfg.Staleness = 30 * time.Second
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = 30 * time.Second
	}
	if cfg.Log == nil {
		cfg.Log = io.Discard
	}
	router, err := findRouter(cfg.Router)
	if err != nil {
		return nil, err
	}
	bin := cfg.PHP
	if bin == "" {
		bin = "php"
	}
	if bin, err = exec.LookPath(bin); err != nil {
		return nil, fmt.Errorf("rubis php: php is not installed (%v): %s", err, InstallHint)
	}
	if err := checkExtensions(ctx, bin); err != nil {
		return nil, err
	}
	mode := "larder"
	if cfg.Direct {
		mode = "direct"
	}
	// -q: no line per request on standard error. OPcache keeps the
	// compiled scripts across requests, as a production PHP would.
	cmd := exec.Command(bin, "-q", "-d", "opcache.enable=1", "-d", "expose_php=0", "-d", "display_errors=stderr",
		"-S", cfg.Listen, router)
	cmd.Dir = filepath.Dir(router)
	cmd.Env = append(os.Environ(),
		"RUBIS_PG="+cfg.DSN, "RUBIS_MODE="+mode,
		"RUBIS_STALENESS="+strconv.FormatFloat(cfg.Staleness.Seconds(), 'f', -1, 64),
		"RUBIS_SQL_NOW="+map[bool]string{true: "1", false: "0"}[cfg.SQLNow])
	if !cfg.Clock.IsZero() {
		cmd.Env = append(cmd.Env, "RUBIS_CLOCK="+strconv.FormatFloat(float64(cfg.Clock.UnixMicro())/1e6, 'f', 6, 64))
	}
	if cfg.Workers > 1 {
		cmd.Env = append(cmd.Env, "PHP_CLI_SERVER_WORKERS="+strconv.Itoa(cfg.Workers))
	}
	// Its own process group, so that Close reaches the workers too; the
	// server dies with this process.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("rubis php: %w", err)
	}
	s := &Server{cmd: cmd, done: make(chan struct{})}
	if err := s.startWatchdog(); err != nil {
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		_ = cmd.Wait()
		return nil, err
	}
	addr := make(chan string, 1)
	var tail tailBuffer
	go func() {
		// Reads until PHP exits: the first "started" line gives the address.
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			tail.add(line)
			if m := startedRE.FindStringSubmatch(line); m != nil {
				if !sent {
					addr <- m[1]
					sent = true
				}
				continue
			}
			fmt.Fprintln(cfg.Log, line)
		}
		_, _ = io.Copy(cfg.Log, stderr)
	}()
	go func() {
		s.err = cmd.Wait()
		close(s.done)
	}()
	wait, cancel := context.WithTimeout(ctx, cfg.StartTimeout)
	defer cancel()
	select {
	case a := <-addr:
		s.url = "http://" + a
	case <-s.done:
		s.Close()
		return nil, fmt.Errorf("rubis php: php -S exited: %v\n%s", s.err, tail.String())
	case <-wait.Done():
		s.Close()
		return nil, fmt.Errorf("rubis php: php -S did not start: %v\n%s", wait.Err(), tail.String())
	}
	for {
		resp, err := http.Get(s.url + "/Home")
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
			err = fmt.Errorf("status %d", resp.StatusCode)
		}
		select {
		case <-s.done:
			s.Close()
			return nil, fmt.Errorf("rubis php: php -S exited: %v\n%s", s.err, tail.String())
		case <-wait.Done():
			s.Close()
			return nil, fmt.Errorf("rubis php: the server does not answer (%v): %v\n%s", wait.Err(), err, tail.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// URL is the server's base URL ("http://127.0.0.1:port").
func (s *Server) URL() string { return s.url }

// PID is the server's process (its workers are its children).
func (s *Server) PID() int { return s.cmd.Process.Pid }

// Close stops the server and its workers. It is idempotent.
func (s *Server) Close() {
	s.once.Do(func() {
		// The server keeps no state: the whole group is killed.
		_ = s.guard.Close()
		_ = s.watchdog.Wait()
		_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
		<-s.done
	})
}

// startWatchdog starts the process that kills the server's group once its
// standard input closes.
func (s *Server) startWatchdog() error {
	w := exec.Command("sh", "-c", `read -r _; kill -KILL "-$0" 2>/dev/null; exit 0`, strconv.Itoa(s.cmd.Process.Pid))
	guard, err := w.StdinPipe()
	if err != nil {
		return err
	}
	if err := w.Start(); err != nil {
		return fmt.Errorf("rubis php: watchdog: %w", err)
	}
	s.watchdog, s.guard = w, guard
	return nil
}

// findRouter resolves router.php.
func findRouter(path string) (string, error) {
	var candidates []string
	if path != "" {
		candidates = []string{path}
	} else {
		if _, file, _, ok := runtime.Caller(0); ok {
			candidates = append(candidates, filepath.Join(filepath.Dir(file), "router.php"))
		}
		candidates = append(candidates, filepath.Join("bench", "rubis", "php", "router.php"))
	}
	for _, c := range candidates {
		if st, err := os.Stat(c); err == nil && !st.IsDir() {
			return filepath.Abs(c)
		}
	}
	return "", fmt.Errorf("rubis php: router.php not found (looked at %s)", strings.Join(candidates, ", "))
}

// checkExtensions fails when php lacks the pgsql extension.
func checkExtensions(ctx context.Context, bin string) error {
	out, err := exec.CommandContext(ctx, bin, "-m").Output()
	if err != nil {
		return fmt.Errorf("rubis php: %s -m: %v: %s", bin, err, InstallHint)
	}
	for _, line := range strings.Split(string(out), "\n") {
		if strings.TrimSpace(line) == "pgsql" {
			return nil
		}
	}
	return fmt.Errorf("rubis php: PHP's pgsql extension is missing: %s", InstallHint)
}

// tailBuffer keeps the last lines of PHP's output for error messages.
type tailBuffer struct {
	mu    sync.Mutex // guards lines
	lines []string
}

func (t *tailBuffer) add(line string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.lines = append(t.lines, line)
	if len(t.lines) > 20 {
		t.lines = t.lines[len(t.lines)-20:]
	}
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return strings.Join(t.lines, "\n")
}
