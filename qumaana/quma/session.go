package quma

import (
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

// Session neutrality. A client keys cached results on its session's state
// (roles and settings), and reads that state again after a statement that
// may have changed it. Most statements cannot: a SELECT, INSERT, UPDATE or
// DELETE that calls only built-in functions which leave the session alone
// and touches only tables that run no user code (no user triggers, rules or
// row security policies, no column defaults calling functions outside
// pg_catalog: Table.RunsCode). Anything else (SET, SET ROLE, DO, CALL, a
// user function, set_config, a view, a table that runs code) may change it.

// sessionNeutralFunctions are built-ins that leave the session's roles and
// settings alone, besides safeFunctions: the clock, sequences, random
// values.
var sessionNeutralFunctions = map[string]bool{
	"now": true, "statement_timestamp": true, "transaction_timestamp": true, "clock_timestamp": true, "timeofday": true,
	"nextval": true, "currval": true, "lastval": true, "setval": true,
	"random": true, "random_normal": true, "gen_random_uuid": true,
}

// sessionNeutral reports whether statement n cannot change the session's
// roles or settings (see above).
func sessionNeutral(schema *Schema, n *pg.Node) bool {
	switch {
	case n.GetSelectStmt() != nil, n.GetInsertStmt() != nil, n.GetUpdateStmt() != nil, n.GetDeleteStmt() != nil:
	default:
		return false
	}
	neutral := true
	ctes := map[string]bool{}
	walk(n, func(m proto.Message) bool {
		if c, ok := m.(*pg.CommonTableExpr); ok {
			ctes[strings.ToLower(c.GetCtename())] = true
		}
		return true
	})
	walk(n, func(m proto.Message) bool {
		if !neutral {
			return false
		}
		switch x := m.(type) {
		case *pg.FuncCall:
			neutral = neutralFunction(schema, x.GetFuncname())
		case *pg.RangeVar:
			if x.GetSchemaname() == "" && ctes[x.GetRelname()] {
				return true
			}
			_, t, _ := schema.Resolve(x.GetSchemaname(), x.GetRelname())
			neutral = t != nil && !t.RunsCode && !t.Temporary
		case *pg.RangeFunction, *pg.CallStmt, *pg.DoStmt, *pg.VariableSetStmt:
			neutral = false
		}
		return neutral
	})
	return neutral
}

// neutralFunction: a built-in (unqualified or in pg_catalog, with no user
// function of that name) known to leave the session alone.
func neutralFunction(schema *Schema, names []*pg.Node) bool {
	parts := make([]string, 0, len(names))
	for _, n := range names {
		parts = append(parts, strings.ToLower(n.GetString_().GetSval()))
	}
	switch {
	case len(parts) == 1:
	case len(parts) == 2 && parts[0] == "pg_catalog":
	default:
		return false
	}
	name := parts[len(parts)-1]
	for qualified := range schema.Functions {
		if qualified == name || strings.HasSuffix(qualified, "."+name) {
			return false // a user function may shadow it
		}
	}
	return safeFunctions[name] || sessionNeutralFunctions[name]
}
