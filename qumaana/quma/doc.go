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
// Derived tag columns reach across a join on a primary key. When an inner
// equality of one scope joins a table's column fk to another table's
// single-column primary key (of the same type), a column c bound on the
// other table binds on the first the derived column fk->schema.table.c
// (tags.DerivedColumn): the value of c in the row its fk names. The region
// search (items.category = $1 AND items.seller = users.id AND users.region =
// $2) is keyed on public.items(category,"seller->public.users.region"), and
// also holds that set's own tag (tags.SetTag), which the invalidator
// publishes while it cannot compute the set's keyed tags. When the other
// reference reads nothing but its key and the derived columns' own columns,
// the derived tags cover every change of it that matters (the invalidator
// publishes the tags of the rows joining a changed row) and its tags are
// held only if the derived ones fall back (Dep.CoveredBy). Not across an
// outer join's nullable side, nor between scopes.
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
