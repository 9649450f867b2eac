package quma

import (
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// Clock-bound queries. PostgreSQL's now() (and CURRENT_TIMESTAMP,
// CURRENT_DATE, CURRENT_TIME, LOCALTIMESTAMP, LOCALTIME, transaction_timestamp())
// is the transaction's start time: a result that reads it is not a function
// of a snapshot alone. A client caches such a query by fixing "now" itself:
// the template's ClockSQL replaces every such read by a parameter, $K (K =
// NumParams+1, a timestamptz), which the client sets to its transaction's
// clock bucket and adds to the cache key. The result is then the query's
// result at the snapshot with now() = the bucket, and results of two
// buckets never mix. Other clock reads ('now'::date, clock_timestamp(),
// statement_timestamp(), timeofday(), the forms with a precision such as
// CURRENT_TIMESTAMP(3)) stay uncacheable.

// clockFunctions are the built-ins that return the transaction's start.
var clockFunctions = map[string]bool{"now": true, "transaction_timestamp": true}

// clockValueTypes maps the SQL value functions that read the transaction's
// start to the type the $K::timestamptz is cast to ("" keeps it).
var clockValueTypes = map[pg.SQLValueFunctionOp]string{
	pg.SQLValueFunctionOp_SVFOP_CURRENT_TIMESTAMP: "",
	pg.SQLValueFunctionOp_SVFOP_CURRENT_DATE:      "date",
	pg.SQLValueFunctionOp_SVFOP_CURRENT_TIME:      "timetz",
	pg.SQLValueFunctionOp_SVFOP_LOCALTIMESTAMP:    "timestamp",
	pg.SQLValueFunctionOp_SVFOP_LOCALTIME:         "time",
}

// isClockCall reports whether a function call reads the transaction's
// start: now() or transaction_timestamp(), unqualified or in pg_catalog,
// without arguments, and not shadowed by a user function of that name
// (schema may be nil: no user functions known).
func isClockCall(schema *Schema, f *pg.FuncCall) bool {
	if !isClockName(f) {
		return false
	}
	names := f.GetFuncname()
	if len(names) == 1 && schema != nil {
		name := strings.ToLower(names[0].GetString_().GetSval())
		for qualified := range schema.Functions {
			if qualified == name || strings.HasSuffix(qualified, "."+name) {
				return false // a user function may be what the path resolves to
			}
		}
	}
	return true
}

// isClockName reports whether a call is now() or transaction_timestamp()
// by name, unqualified or in pg_catalog, without arguments.
func isClockName(f *pg.FuncCall) bool {
	if f == nil || len(f.GetArgs()) > 0 || f.GetAggStar() || f.GetOver() != nil {
		return false
	}
	names := f.GetFuncname()
	parts := make([]string, 0, len(names))
	for _, n := range names {
		parts = append(parts, strings.ToLower(n.GetString_().GetSval()))
	}
	switch len(parts) {
	case 1:
		return clockFunctions[parts[0]]
	case 2:
		return parts[0] == "pg_catalog" && clockFunctions[parts[1]]
	}
	return false
}

// clockRead returns the replacement of a node that reads the transaction's
// start (nil if it does not): $param::timestamptz, cast on as the read's
// type requires.
func clockRead(schema *Schema, n *pg.Node, param int32) *pg.Node {
	var to string
	switch {
	case isClockCall(schema, n.GetFuncCall()):
	case n.GetSqlvalueFunction() != nil:
		t, ok := clockValueTypes[n.GetSqlvalueFunction().GetOp()]
		if !ok {
			return nil
		}
		to = t
	default:
		return nil
	}
	r := typeCast(pg.MakeParamRefNode(param, -1), "timestamptz")
	if to != "" {
		r = typeCast(r, to)
	}
	return r
}

// typeCast is arg::pg_catalog.name.
func typeCast(arg *pg.Node, name string) *pg.Node {
	return &pg.Node{Node: &pg.Node_TypeCast{TypeCast: &pg.TypeCast{Arg: arg, TypeName: typeName(name), Location: -1}}}
}

func typeName(name string) *pg.TypeName {
	return &pg.TypeName{Names: []*pg.Node{pg.MakeStrNode("pg_catalog"), pg.MakeStrNode(name)}, Typemod: -1, Location: -1}
}

// rewriteClock replaces, in place, every read of the transaction's start
// in res by $param (see clockRead) and reports how many it replaced.
func rewriteClock(schema *Schema, res *pg.ParseResult, param int32) int {
	n := 0
	var visit func(m protoreflect.Message)
	visit = func(m protoreflect.Message) {
		if !m.IsValid() {
			return
		}
		if rf, ok := m.Interface().(*pg.RangeFunction); ok {
			// FROM now(): a function in FROM names its column after
			// itself; a parameter there would change the result's shape.
			for _, f := range rf.GetFunctions() {
				for _, item := range f.GetList().GetItems() {
					if isClockCall(schema, item.GetFuncCall()) || clockColumnName(schema, item) != "" {
						n = -1 << 30
					}
				}
			}
		}
		if rt, ok := m.Interface().(*pg.ResTarget); ok && rt.GetName() == "" {
			// PostgreSQL names an unaliased clock read after the function
			// (now, current_date); a cast would be named after its type.
			if name := clockColumnName(schema, rt.GetVal()); name != "" {
				rt.Name = name
			}
		}
		if node, ok := m.Interface().(*pg.Node); ok {
			if r := clockRead(schema, node, param); r != nil {
				node.Node = r.Node
				n++
				return
			}
		}
		m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
			if fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.GroupKind {
				return true
			}
			switch {
			case fd.IsList():
				l := v.List()
				for i := 0; i < l.Len(); i++ {
					visit(l.Get(i).Message())
				}
			case fd.IsMap():
			default:
				visit(v.Message())
			}
			return true
		})
	}
	visit(res.ProtoReflect())
	return n
}

// clockColumnName is the column name PostgreSQL gives an unaliased target
// that is a clock read ("" for any other expression).
func clockColumnName(schema *Schema, n *pg.Node) string {
	if f := n.GetFuncCall(); f != nil && isClockCall(schema, f) {
		names := f.GetFuncname()
		return strings.ToLower(names[len(names)-1].GetString_().GetSval())
	}
	if v := n.GetSqlvalueFunction(); v != nil {
		if _, ok := clockValueTypes[v.GetOp()]; ok {
			switch v.GetOp() {
			case pg.SQLValueFunctionOp_SVFOP_CURRENT_TIMESTAMP:
				return "current_timestamp"
			case pg.SQLValueFunctionOp_SVFOP_CURRENT_DATE:
				return "current_date"
			case pg.SQLValueFunctionOp_SVFOP_CURRENT_TIME:
				return "current_time"
			case pg.SQLValueFunctionOp_SVFOP_LOCALTIMESTAMP:
				return "localtimestamp"
			case pg.SQLValueFunctionOp_SVFOP_LOCALTIME:
				return "localtime"
			}
		}
	}
	return ""
}

// clockSQL returns sql with every read of the transaction's start replaced
// by $(numParams+1), deparsed; "" when it reads none or cannot be
// rewritten.
func clockSQL(schema *Schema, sql string, numParams int) string {
	res, err := pg.Parse(sql)
	if err != nil {
		return ""
	}
	if rewriteClock(schema, res, int32(numParams+1)) <= 0 {
		return ""
	}
	out, err := pg.Deparse(res)
	if err != nil {
		return ""
	}
	return out
}
