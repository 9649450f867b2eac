// Package redisstore is the production store.Backend (and
// store.Persistent): a cache-node's versions kept in a Redis 7 the node
// fronts, with the same answers as the memory backend (package storetest
// checks both against the same suite and against each other).
//
// # One Redis
//
// New takes a *redis.Client: one server, or a Sentinel-managed primary
// (redis.NewFailoverClient). Cluster and Ring clients are refused: the
// cache-nodes' DHT already spreads keys over nodes, each node fronts its
// own Redis, and the scripts read keys whose names they find in the index
// sets, which a cluster would place on other shards.
//
// # Layout
//
// Every key starts with the prefix P (Options.Prefix, "larder" by default,
// then a colon). K is the cache key as the client sent it (bytes), S a
// snapshot as 8 big-endian bytes, M = S+K the name of one version.
//
//	P:v:M           string, with a TTL   the version's value, nothing else
//	P:d:K           hash, no TTL         the directory of K: field S -> entry
//	P:t:<tag>       set, no TTL          unsettled versions (M) depending on the tag
//	P:T:<table>     set, no TTL          unsettled versions depending on the table
//	P:nodeps        set, no TTL          unsettled versions depending on nothing
//	P:closed        set, no TTL          unsettled closed versions (what Settle visits)
//	P:tables        set, no TTL          the tables that have a P:T set
//	P:n             hash, no TTL         counts: keys, versions, bytes
//	P:g, P:gi       string, counter      the ring of recently evicted keys
//	P:wm            string, no TTL       the node's saved watermark (decimal)
//
// An entry is lo (8 bytes), hi (8; 0xff.. = open), flags (1: pending, 2:
// settled),
// size (4: store.Version.Size) and the dependencies, each as allColumns
// (1), tag, table and the columns read, every name prefixed with its
// 2-byte length. Names are bytes: nothing assumes printable keys or tags.
//
// The value lives apart from its entry so that a lookup reads the
// directory (to choose a version) and GETs one value: only the value
// served has its LRU clock refreshed, as in the memory backend's
// per-version LRU. The entry keeps the dependencies so that a version can
// be taken out of the index sets whatever happened to its value.
//
// # Scripts
//
// Lookup, Put, Confirm, Invalidate, EndOpen and Holds are each one Lua
// script (EVALSHA), atomic on the server. Timestamps are compared as pairs
// of exact 32-bit halves (Lua numbers are doubles; string comparison in
// Lua follows the server's locale). Invalidate reads only the index sets
// of the changed tags (the table sets for flushes), never the keyspace,
// and applies invalidation.Change.Hits to each member's dependencies,
// open or closed (a version it ends stays in its sets until Settle or
// EndOpen settles it). Holds takes random
// members of the set until it finds a live one, dropping the dead ones it
// meets. Every script but Put may run when Redis is out of memory
// (allow-oom): ending versions must not fail for lack of memory; a Put
// then fails with Redis's OOM error.
//
// # Eviction
//
// Redis evicts with maxmemory-policy volatile-lru, which picks only keys
// that have a TTL: the values (Options.TTL, 7 days by default, refreshed
// when a version is put again — not on a hit, which would make every read
// a write to the replicas and the append-only file). Everything else has
// no TTL and is never evicted, for a reason each:
//
//   - An evicted index set would leave the versions in it open forever:
//     invalidations find versions through the sets, so a version missing
//     from its tag's set would never get its end, and be served as valid
//     after its data changed — a stale result. The index sets are the
//     store's correctness.
//   - The directory holds the entries, which carry the dependencies: a
//     version whose value is evicted can still be taken out of its sets
//     exactly, and the counts stay exact.
//
// This bookkeeping is small (an entry and a set member or two per version,
// against the value) and shrinks with the data: when Redis evicts a value
// it publishes a keyevent notification, and a subscriber in the store runs
// a script that drops that version's entry and index memberships and, if
// it was the key's last version, remembers the key as evicted. The store
// always subscribes to these notifications (keyevent notifications of
// evicted and expired keys); the server sends them when its
// notify-keyspace-events has E, e and x (see Server settings).
// Notifications are at most once (a reconnection loses them);
// every script that meets a version whose value is gone cleans it up the
// same way: Lookup (the versions it chooses from, and all versions of the
// key on a miss), Invalidate and Holds (the members they read), Put (two
// random members of each set it joins, which keeps dead members a bounded
// share of a set). Without notifications, entries of evicted versions
// that no script meets stay until their key is looked up again.
//
// If what cannot be evicted fills maxmemory, Redis refuses writes: Put
// fails, and the node caches nothing more until invalidations and EndOpen
// (which always run) free the index sets.
//
// # Server settings
//
// The store needs no CONFIG rights: maxmemory, maxmemory-policy and
// notify-keyspace-events are the operator's settings (redis.conf), which
// New reads and checks. It reads maxmemory and maxmemory-policy from INFO
// memory. notify-keyspace-events cannot be read without CONFIG GET: New
// lets a key of its own (P:probe:<token>) expire a millisecond after it
// sets it, reads it until it is gone (a read expires a key past its time
// at once), and sees whether the notification reached its subscriber
// before a PING sent after. What it finds is in Store.Server, and each
// setting is judged by what it costs:
//
//   - A maxmemory-policy other than volatile-lru, volatile-lfu,
//     volatile-random, volatile-ttl or noeviction (allkeys-lru, say) may
//     evict index sets, and a version missing from its sets is served
//     after its data changed: New refuses it with an error, and so does
//     EndOpen when a server that restarted comes back with it.
//   - A maxmemory that leaves nothing above the baseline (see Budget)
//     would have Redis refuse every Put: an error.
//   - Costs of efficiency only are warnings, logged (Options.Log) and in
//     ServerSettings.Warnings: no maxmemory (Redis never evicts; the
//     store grows until its values expire); noeviction (once maxmemory is
//     reached every Put fails until values expire); another volatile
//     policy (values only are evicted, as needed, but not the least
//     recently used first); a budget (maxmemory above the baseline) more
//     than an eighth from Options.MaxMemory, the node's; no notification
//     of the probe's expiry (the lazy cleanup described above does their
//     work, later, and Stats' counts include the dangling entries until
//     then). The notifications of evicted keys (the e flag) cannot be
//     observed without an eviction: they are taken to be set with the
//     others.
//
// Options.ConfigureServer is for a Redis the caller owns (tests): New then
// sets the three itself with CONFIG SET, as described under Budget.
//
// The Redis user needs, besides its keys (P:*), the channels
// __keyevent@<db>__:evicted and __keyevent@<db>__:expired and the
// commands the store sends: PING, INFO, GET, HGET, HMGET, SCAN, SCRIPT
// LOAD, EVALSHA, SUBSCRIBE (SELECT and CLIENT SETNAME if the URL asks for
// them), and those its scripts call: HSET, HGETALL, HINCRBY, HDEL, SADD,
// SRANDMEMBER, SMEMBERS, SREM, SET, PEXPIRE, EXISTS, STRLEN, INCR,
// SETRANGE, DEL. internal/servers.RedisCacheNodeACL is that rule set for
// the prefix larder; the tests run the store as a user with it. Errors
// name the server's address and the user, never the password.
//
// # Budget and Stats
//
// The budget is the room for the store's data: maxmemory is the server's,
// so a Redis has one budgeted store. New measures a baseline: used_memory
// once the store is set up (start-up memory, connections, the scripts,
// the ghost ring, Redis's per-command bookkeeping, which New allocates by
// running every command once), minus the size of the versions already
// held (a restart on a warm Redis). Redis evicts before a command runs;
// what the command then allocates, such as the INFO reply that reads
// used_memory, is above the line: a margin m of at most 4 KiB (an eighth
// of a small budget) covers it. The budget is then maxmemory - baseline +
// m, as New found maxmemory (0, unlimited, when the server has none).
// With ConfigureServer, New instead sets maxmemory to baseline +
// MaxMemory - m with maxmemory-policy volatile-lru, and the budget is
// MaxMemory. A version larger than the budget is refused
// (store.ErrTooLarge).
//
// Stats reports Keys and Versions from the store's counts (exact while
// notifications flow; Stats first waits until every notification sent
// before it is applied), Bytes = used_memory minus the baseline (so it
// includes connections opened later: the whole server is held to the
// budget), Budget = the budget above, and Evictions = INFO evicted_keys,
// which counts values only when the server is the store's alone.
//
// # Misses
//
// A lookup that finds versions classifies the miss like the memory
// backend. A key whose versions were all evicted is remembered in a ring
// of fingerprints (4 bytes each; 4 bytes for every 64 of budget, between
// 1024 and 65536 keys) and reported as a capacity miss, like the memory
// backend's ghost set; a key evicted long ago, or one whose eviction was
// never seen (notifications off and no script met it), is reported as a
// compulsory miss. Fingerprints can collide: a never-seen key is reported
// as a capacity miss with a probability of about ring size / 2^32.
//
// # Restart
//
// SaveWatermark stores the node's watermark under P:wm (no TTL). After a
// restart (of the node, or of a persistent Redis) the node reads it with
// SavedWatermark and calls EndOpen(wm+1) before serving: whatever was open
// is proved only up to there. That is sound with an append-only file that
// loses its last second: the file is in order, so a watermark it kept was
// saved after every invalidation up to it, which it kept too.
//
// The store notices a Redis that restarts under it: it runs scripts of its
// own (a random token in their source) and never loads them again on its
// own, so a NOSCRIPT answer means the server lost them. It then refuses
// every operation with store.ErrLost until the node's EndOpen, which ends
// every version at the watermark that server kept + 1 at the latest (a
// persistent server may have lost the invalidations of its last second).
// Settle saves the watermark in the same script that settles versions, so
// the file never holds a version settled beyond its saved watermark. Such
// a server comes back with its configuration file's settings (those
// ConfigureServer set are gone): EndOpen checks the policy again.
package redisstore
