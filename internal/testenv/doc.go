// Package testenv gives integration tests real, throwaway servers: a
// PostgreSQL 15 cluster (wal_level=logical, fsync=off) made by initdb in a
// temporary directory, NATS with JetStream embedded in-process, and a
// redis-server without persistence — each on a free loopback port, each
// removed afterwards.
//
// # Use
//
// Per package, started once in TestMain:
//
//	var env *testenv.Env
//
//	func TestMain(m *testing.M) {
//		os.Exit(testenv.Main(m, testenv.Need{Postgres: true, NATS: true}, &env))
//	}
//
// Per test, when isolation matters:
//
//	pg := testenv.Postgres(t)
//	url := testenv.Database(t, pg) // a fresh database on a shared server
//
// # Failure, never a skip
//
// A server that cannot start — a missing binary above all — fails the test
// (or the whole package, from TestMain) with the command that installs it.
// Nothing is skipped silently.
//
// # Cleanup
//
// Servers are stopped and their directories removed by t.Cleanup or when Main
// returns, also when a test fails or panics. Server processes carry a
// parent-death signal, so even a killed test binary leaves no server behind;
// directories it could not remove are swept by the next run (each records the
// pid that owns it).
package testenv
