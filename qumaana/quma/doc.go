// Package quma is Larder's QUMA analyzer: it maps SQL templates to the
// invalidation tags their results depend on (queries) and publish (writes),
// and chooses, per table, the tag column sets the invalidator publishes.
//
// # The contract
//
// Soundness: for any query template Q and write W, if some instantiation of W
// can change some instantiation of Q's result, then at run time W publishes a
// tag that Q's result holds, and W changes a column Q reads. Precision comes
// second: anything the analysis does not understand falls back to the table
// tag (reading all the columns it cannot rule out), with the reason.
//
// # What is understood
//
// For each base table a query reads, the conjunctive part of WHERE and of
// inner joins' ON (and of outer joins' ON, for the nullable side only) gives
// bindings: col = $n, col = literal, col IN (...), col = ANY($n); equalities
// between columns close them (items.seller = users.id AND users.id = $3 binds
// items.seller). When every column of one of the table's tag column sets is
// bound, the result holds keyed tags (one per combination of values); else the
// table tag. Subqueries, CTEs, set operations and views are analyzed as their
// own scopes; their tables get their own tags.
//
// Keyed tags are used only on columns whose types have a canonical text form
// (integers, text, varchar, bool, uuid): a parameter's text and a row's text
// then agree exactly when the values are equal.
//
// # Use
//
// Offline, AnalyzeWorkload turns a schema and a workload into a Solution
// (the QUMA file, JSON). Online, NewAnalyzer(solution) prepares SQL texts once
// (Prepare parses and analyzes; later calls are a map lookup) and
// (*Template).Tags instantiates a template's tags for parameter values.
//
// # Thread safety
//
// An Analyzer is safe for concurrent use. Templates and Solutions are
// immutable after they are returned.
package quma
