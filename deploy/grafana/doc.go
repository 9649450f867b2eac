// Package grafana holds Larder's Grafana dashboard, larder.json, importable
// as it is (Dashboards → New → Import; or a provisioning folder): hit rate
// overall and per query template, misses by class, cache-node memory and
// evictions, invalidation lag and publish latency, the replication slot's
// retained WAL, client fallbacks, cache-node errors and circuit breakers,
// and tag column set registrations.
//
// # Variables
//
// $datasource is the Prometheus data source. $node_job, $client_job and
// $invalidator_job are the Prometheus jobs scraping the cache-nodes, the
// applications that export client-lib's metrics (Config.Metrics), and the
// invalidators; each defaults to every job exporting that component's
// metrics. $template selects query templates by id — the pg_query
// fingerprint `qumaana explain` prints.
//
// # The test
//
// The package's test reads every PromQL expression of the dashboard,
// extracts the metric names it selects, and checks that the component its
// job variable names registers each of them: the cache-node's metrics
// (package node, the protocol server's collector, the daemon's process
// collectors), the invalidator's (publisher and pincushion) and
// client-lib's (larder.MetricsRegistry). A histogram's _bucket, _sum and
// _count series count as its own. A panel naming a metric nobody exports,
// or the wrong component's, fails the test; so does a metric
// `qumaana explain` reads (explain.Metrics) that its component does not
// export.
package grafana
