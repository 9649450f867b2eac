package quma

import (
	"fmt"
	"sort"
	"strings"
)

// Schema is what the analyzer knows of the database: tables, views and
// function volatility. It is loaded from a DDL file (LoadDDL) or from a live
// database's catalogs (LoadCatalog), and is embedded in the QUMA file so that
// client-lib analyzes queries online exactly as the CLI did offline.
//
// A Schema is immutable once built and safe for concurrent readers.
type Schema struct {
	// Tables by qualified name, "schema.table" (unquoted, as stored in the catalog).
	Tables map[string]*Table `json:"tables"`
	// Views by qualified name; each is expanded to its defining query.
	Views map[string]*View `json:"views,omitempty"`
	// Functions maps a function name ("schema.name" for user functions, the
	// bare name for built-ins) to its volatility. Built-ins not listed here are
	// judged by the analyzer's own lists.
	Functions map[string]Volatility `json:"functions,omitempty"`
	// SearchPath resolves unqualified names; default ["public"].
	SearchPath []string `json:"search_path,omitempty"`
}

// Table describes one table.
type Table struct {
	Name    string   `json:"name"` // "schema.table"
	Columns []Column `json:"columns"`
	// PrimaryKey lists the primary key columns, if any.
	PrimaryKey []string `json:"primary_key,omitempty"`
	// UniqueKeys lists the column sets of unique constraints and unique indexes (without expressions or predicates).
	UniqueKeys [][]string `json:"unique_keys,omitempty"`
	// ReplicaIdentity is "default", "full", "nothing" or "index".
	ReplicaIdentity string `json:"replica_identity"`
	// IdentityColumns are the columns the replica identity supplies in a
	// change's old row: the primary key for "default", the index's columns for
	// "index", every column for "full", none for "nothing".
	IdentityColumns []string `json:"identity_columns,omitempty"`
	// Temporary marks a temporary table; reads of it are not cacheable.
	Temporary bool `json:"temporary,omitempty"`
	// RunsCode marks a table whose reads or writes may run user code: user
	// triggers, rules, row security policies, column defaults or generated
	// columns calling functions outside pg_catalog, inheritance children.
	// Statements on it may change the session's settings (see session.go).
	// Known from a live catalog only; a schema read from DDL leaves it
	// false, and clients use the live catalog.
	RunsCode bool `json:"runs_code,omitempty"`
}

// Column is one column of a table.
type Column struct {
	Name string `json:"name"`
	// Type is the base type's name as pg_type spells it: int4, int8, text,
	// varchar, bpchar, bool, uuid, numeric, timestamp, ...
	Type    string `json:"type"`
	NotNull bool   `json:"not_null,omitempty"`
}

// View is a view, analyzed by expanding its query.
type View struct {
	Name  string `json:"name"`
	Query string `json:"query"`
}

// Volatility is PostgreSQL's provolatile: immutable, stable or volatile.
type Volatility string

// Volatility values, as pg_proc.provolatile spells them.
const (
	Immutable Volatility = "i"
	Stable    Volatility = "s"
	Volatile  Volatility = "v"
)

// NewSchema returns an empty schema with search_path public.
func NewSchema() *Schema {
	return &Schema{Tables: map[string]*Table{}, Views: map[string]*View{}, Functions: map[string]Volatility{}, SearchPath: []string{"public"}}
}

// Column returns the named column of t, or nil.
func (t *Table) Column(name string) *Column {
	for i := range t.Columns {
		if t.Columns[i].Name == name {
			return &t.Columns[i]
		}
	}
	return nil
}

// ColumnNames returns the table's column names in table order.
func (t *Table) ColumnNames() []string {
	out := make([]string, len(t.Columns))
	for i, c := range t.Columns {
		out[i] = c.Name
	}
	return out
}

// Keys returns the primary key and unique keys, smallest first.
func (t *Table) Keys() [][]string {
	var keys [][]string
	if len(t.PrimaryKey) > 0 {
		keys = append(keys, t.PrimaryKey)
	}
	keys = append(keys, t.UniqueKeys...)
	sort.SliceStable(keys, func(i, j int) bool { return len(keys[i]) < len(keys[j]) })
	return keys
}

// IdentityCovers reports whether the replica identity supplies every column
// of cols in a change's old row.
func (t *Table) IdentityCovers(cols []string) bool {
	if t.ReplicaIdentity == "full" {
		return true
	}
	have := map[string]bool{}
	for _, c := range t.IdentityColumns {
		have[c] = true
	}
	for _, c := range cols {
		if !have[c] {
			return false
		}
	}
	return true
}

// Resolve finds a table or view by a possibly unqualified name, using the
// search path. It returns the qualified name and which of the two it is.
func (s *Schema) Resolve(schema, name string) (qualified string, table *Table, view *View) {
	if schema != "" {
		q := schema + "." + name
		return q, s.Tables[q], s.Views[q]
	}
	path := s.SearchPath
	if len(path) == 0 {
		path = []string{"public"}
	}
	for _, sp := range path {
		q := sp + "." + name
		if t := s.Tables[q]; t != nil {
			return q, t, nil
		}
		if v := s.Views[q]; v != nil {
			return q, nil, v
		}
	}
	return path[0] + "." + name, nil, nil
}

// Validate checks internal consistency: keys name existing columns.
func (s *Schema) Validate() error {
	for name, t := range s.Tables {
		if t.Name != name {
			return fmt.Errorf("quma: schema: table %q stored under %q", t.Name, name)
		}
		for _, key := range append([][]string{t.PrimaryKey, t.IdentityColumns}, t.UniqueKeys...) {
			for _, c := range key {
				if t.Column(c) == nil {
					return fmt.Errorf("quma: schema: table %s: key column %q does not exist", name, c)
				}
			}
		}
		switch t.ReplicaIdentity {
		case "default", "full", "nothing", "index":
		default:
			return fmt.Errorf("quma: schema: table %s: replica identity %q", name, t.ReplicaIdentity)
		}
	}
	return nil
}

// keyableTypes are the column types whose text output form is canonical for
// equality: two values are equal exactly when their text forms are equal. Only
// columns of these types carry keyed tags; an equality on any other type (a
// float, a numeric with scale, a padded char, a timestamp with its zone) falls
// back to the table tag, because a parameter's text and the row's text could
// differ for equal values and a keyed tag would then miss an invalidation.
var keyableTypes = map[string]bool{
	"int2": true, "int4": true, "int8": true, "oid": true,
	"text": true, "varchar": true, "name": true,
	"bool": true, "uuid": true,
}

// Keyable reports whether a column of type typ can carry keyed tags.
func Keyable(typ string) bool { return keyableTypes[strings.ToLower(typ)] }
