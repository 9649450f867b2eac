// Package servers starts and stops the real servers Larder depends on —
// PostgreSQL 15, NATS with JetStream, and Redis 7 — as local processes (or,
// for NATS, embedded in-process) on free loopback ports.
//
// Two users share it: internal/testenv, which gives every integration test
// throwaway servers in temporary directories, and deploy/local, the one-command
// local stack that keeps its data in a chosen folder across restarts.
//
// # Processes
//
// Child processes are started with a parent-death signal, so they die with the
// process that started them even when it panics or is killed; Close stops them
// gracefully first (SIGINT for PostgreSQL's fast shutdown, SIGTERM for Redis)
// and kills them after a grace period.
//
// # Running as root
//
// PostgreSQL refuses to run as root. When the caller is root, initdb and
// postgres run as the unprivileged "postgres" OS user that Debian's
// postgresql-15 package creates, and the data directory is handed to it.
//
// # Missing binaries
//
// A missing server binary is reported as a *MissingBinaryError carrying the
// command that installs it; callers fail with it and never skip.
//
// # Thread safety
//
// Each server value is safe for concurrent use; Close is idempotent.
package servers
