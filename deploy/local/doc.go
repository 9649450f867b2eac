// Command local runs Larder's local stack — the embedded default a newcomer
// starts first: PostgreSQL 15 (wal_level=logical), NATS with JetStream, and
// Redis, with all their data kept in one folder so it survives restarts.
//
//	go run ./deploy/local up     [flags]   # start, print URLs, run until Ctrl-C / SIGTERM
//	go run ./deploy/local demo   [flags]   # start, exercise every server, print what it saw, stop
//
// # Ports and files
//
// By default the servers listen on 127.0.0.1 ports 15432 (PostgreSQL), 14222
// (NATS) and 16379 (Redis), beside rather than on the usual ones, and keep
// their data in ./.larder-local. The URLs are printed and written to
// .larder-local/stack.env for other tools to source. The invalidator and the
// cache-node log to .larder-local/logs; the cache-node serves /metrics on
// 127.0.0.1:19189 (-cache-node-metrics), the invalidator on 19188.
//
// # Several cache-nodes
//
// -cache-nodes N runs N cache-nodes in a libp2p overlay (a pre-shared
// network key, made at each start, and an allow-list of their identities,
// kept across starts, in .larder-local/secrets), on ports from
// -cache-node-port up (metrics from -cache-node-metrics up). LARDER_DSN
// then lists them all with larder.node-placement=home: the first is the
// application's home node and forwards each key to its master;
// LARDER_CACHE_NODES and LARDER_CACHE_NODES_METRICS list them.
// -broadcast-invalidation runs the nodes in the broadcast ablation.
// -standalone-cache-nodes M runs M more nodes outside the overlay, on the
// ports after its nodes, each caching alone (LARDER_STANDALONE_NODES and
// LARDER_STANDALONE_NODES_METRICS): rubis-bench's local-only caching with
// several application servers. With two nodes or more, `demo` puts a key
// the second node masters through the first, reads it back through the
// first and shows that only its master holds it (make demo runs
// `demo -cache-nodes 2`).
//
// # The PostgreSQL wire front
//
// LARDER_PROXY_URL (127.0.0.1:16432, -front-port) is a front that speaks
// PostgreSQL's protocol (client-lib/pgfront): psql, PHP and any driver
// connect to it as to PostgreSQL; transactions begun READ ONLY read through
// Larder, everything else goes to PostgreSQL unchanged. `demo` runs psql
// through it twice; the second read is a cache hit. Its metrics are on
// 127.0.0.1:19187 (-front-metrics).
//
// # The application's QUMA file and replica identities
//
// -quma FILE names the application's QUMA file in LARDER_DSN (and starts the
// invalidator with its tag column sets); its clients register any other set
// at run time. A table whose replica identity lacks its tag columns keeps
// the invalidator waiting, PostgreSQL up, with the ALTER TABLE to run printed;
// it retries every 3 s. -fix-replica-identity lets it run the fix itself.
//
// # NATS
//
// NATS runs as the standalone nats-server binary (installed by `make deps`),
// as it would in a deployment; -nats-bin embedded runs it in this process.
//
// # Running as root
//
// PostgreSQL runs as the "postgres" OS user; the data folder must be reachable
// by it (a folder under /root is not, and start-up says so).
//
// # Stopping
//
// Ctrl-C or SIGTERM stops Redis, NATS and PostgreSQL in that order, each
// gracefully, and removes stack.env.
package main
