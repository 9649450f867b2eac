package servers

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// stopGrace is how long a server gets to shut down after its stop signal
// before it is killed: PostgreSQL's fast shutdown with fsync=off takes well under a second.
const stopGrace = 10 * time.Second

// process is a supervised child server process.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	stopSig syscall.Signal

	done    chan struct{} // closed when the process has exited
	waitErr error         // set before done is closed

	closeOnce sync.Once
	closeErr  error
}

// osUser is the identity a child runs as; nil means the caller's own.
type osUser struct {
	uid, gid uint32
	name     string
}

// startProcess starts bin with args, appending stdout and stderr to logPath.
// The child is killed by the kernel if this process dies (Pdeathsig).
func startProcess(name, bin string, args []string, logPath string, as *osUser, stopSig syscall.Signal) (*process, error) {
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("larder/servers: open %s log: %w", name, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if as != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: as.uid, Gid: as.gid}
		cmd.Env = append(os.Environ(), "HOME="+os.TempDir(), "USER="+as.name, "LOGNAME="+as.name)
	}
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("larder/servers: start %s: %w", name, err)
	}
	p := &process{name: name, cmd: cmd, logPath: logPath, stopSig: stopSig, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		_ = logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has already exited.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop signals the process, waits up to stopGrace, then kills it. Idempotent.
func (p *process) stop() error {
	p.closeOnce.Do(func() {
		if p.exited() {
			return
		}
		_ = p.cmd.Process.Signal(p.stopSig)
		select {
		case <-p.done:
		case <-time.After(stopGrace):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
			p.closeErr = fmt.Errorf("larder/servers: %s did not stop within %s and was killed", p.name, stopGrace)
		}
	})
	return p.closeErr
}

// logTail returns the last bytes of the process log, for error messages.
func (p *process) logTail() string { return fileTail(p.logPath, 2048) }

func fileTail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(bytes.TrimSpace(b))
}

// waitReady polls check until it succeeds, the process exits, or ctx ends.
func waitReady(ctx context.Context, p *process, check func(context.Context) error) error {
	var last error
	for {
		if p != nil && p.exited() {
			return fmt.Errorf("%w: %s exited during start-up (%v); log:\n%s", ErrNotReady, p.name, p.waitErr, p.logTail())
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		last = check(cctx)
		cancel()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			tail := ""
			if p != nil {
				tail = "; log:\n" + p.logTail()
			}
			return fmt.Errorf("%w: %v (last error: %v)%s", ErrNotReady, ctx.Err(), last, tail)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// FreePort returns a TCP port on 127.0.0.1 that was free a moment ago.
// Callers that bind it later retry on a collision.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("larder/servers: find a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// lookPath finds a binary in dirs, then (when usePath) on $PATH.
func lookPath(name string, dirs []string, usePath bool, hint string) (string, error) {
	for _, dir := range dirs {
		p := dir + "/" + name
		if st, err := os.Stat(p); err == nil && !st.IsDir() && st.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	looked := append([]string{}, dirs...)
	if usePath {
		if p, err := exec.LookPath(name); err == nil {
			return p, nil
		}
		looked = append(looked, "$PATH")
	}
	return "", &MissingBinaryError{Name: name, Looked: looked, Hint: hint}
}

// findBinary resolves bin: a path is taken as it is; a bare name, or
// defaultName when bin is empty, is looked up in dirs and then on $PATH.
func findBinary(bin, defaultName string, dirs []string, hint string) (string, error) {
	if strings.Contains(bin, "/") {
		return lookPath(filepath.Base(bin), []string{filepath.Dir(bin)}, false, hint)
	}
	if bin == "" {
		bin = defaultName
	}
	return lookPath(bin, dirs, true, hint)
}

// goBinDirs lists where `go install` puts binaries.
func goBinDirs() []string {
	var dirs []string
	if d := os.Getenv("GOBIN"); d != "" {
		dirs = append(dirs, d)
	}
	if d := os.Getenv("GOPATH"); d != "" {
		dirs = append(dirs, filepath.Join(filepath.SplitList(d)[0], "bin"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		dirs = append(dirs, filepath.Join(home, "go", "bin"))
	}
	return dirs
}

// unprivilegedUser returns the OS user servers that refuse root run as, or nil
// when the caller is not root.
func unprivilegedUser(name string) (*osUser, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("larder/servers: running as root, and the %q OS user to run PostgreSQL as does not exist (%v); install it: apt-get install postgresql-15", name, err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("larder/servers: user %q: %w", name, err)
	}
	return &osUser{uid: uint32(uid), gid: uint32(gid), name: name}, nil
}

// chownTree hands dir (recursively) to u; a nil u is a no-op.
func chownTree(dir string, u *osUser) error {
	if u == nil {
		return nil
	}
	return filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if err := os.Lchown(path, int(u.uid), int(u.gid)); err != nil {
			return fmt.Errorf("larder/servers: chown %s: %w", path, err)
		}
		return nil
	})
}

// runAs runs a short command to completion, returning its combined output on failure.
func runAs(ctx context.Context, as *osUser, bin string, args ...string) error {
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if as != nil {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: as.uid, Gid: as.gid}
		cmd.Env = append(os.Environ(), "HOME="+os.TempDir(), "USER="+as.name, "LOGNAME="+as.name)
	}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return fmt.Errorf("larder/servers: %s %v: %w\n%s", bin, args, err, bytes.TrimSpace(out))
	}
	return nil
}
