package quma

import (
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/larderdb/larder/internal/tags"
)

// valueSource is where a bound column's value comes from.
type valueSource struct {
	Param   int    // 1-based $n; 0 for a literal
	Array   bool   // the parameter is an array: col = ANY($n) binds each element
	Literal string // the literal's text (Param == 0)
	IsNull  bool   // a NULL literal: never equal to anything
}

func (v valueSource) String() string {
	switch {
	case v.IsNull:
		return "NULL"
	case v.Param > 0 && v.Array:
		return "$" + strconv.Itoa(v.Param) + "[]"
	case v.Param > 0:
		return "$" + strconv.Itoa(v.Param)
	}
	if bareNumber(v.Literal) {
		return v.Literal
	}
	return "'" + strings.ReplaceAll(v.Literal, "'", "''") + "'"
}

func bareNumber(s string) bool {
	_, err := strconv.ParseInt(s, 10, 64)
	return err == nil
}

// relRef is one reference to a base table in a query (a table read twice is two refs).
type relRef struct {
	alias    string // name it is referenced by in its scope
	name     string // qualified table name
	table    *Table // nil when the table is not in the schema
	reads    map[string]bool
	all      bool                     // reads every column (SELECT *, whole-row use, unknown table)
	bound    map[string][]valueSource // column → alternatives, after closure
	notes    []string                 // predicates on it that were not understood
	nullable bool                     // on the nullable side of an outer join
	split    *RowSplit                // how a result narrows to its rows (rows.go)
	// derived holds the derived columns bound in bound (tags.DerivedColumn),
	// by name: columns of the rows other references join to by their
	// primary key.
	derived map[string]derivation
}

// derivation is where a derived column of a reference comes from: column
// col, of type typ, of the reference through its primary key, which the
// reference's column fk equals.
type derivation struct {
	through *relRef
	fk      string
	col     string
	typ     string
}

// columnType returns the type of a column of r, derived or plain, or "".
func (r *relRef) columnType(c string) string {
	if dv, ok := r.derived[c]; ok {
		return dv.typ
	}
	if r.table != nil {
		if col := r.table.Column(c); col != nil {
			return col.Type
		}
	}
	return ""
}

func (r *relRef) read(col string) {
	if r.table != nil && r.table.Column(col) == nil {
		r.all = true // a system column or a typo: assume the worst
		return
	}
	r.reads[col] = true
}

func (r *relRef) note(format string, args ...any) {
	n := fmt.Sprintf(format, args...)
	for _, have := range r.notes {
		if have == n {
			return
		}
	}
	r.notes = append(r.notes, n)
}

// scope is one query level (a SELECT, a subquery, a CTE body).
type scope struct {
	parent  *scope
	rels    []*relRef
	opaque  map[string]bool // aliases of subselects, CTE refs, functions, views
	anyOpaq bool
	ctes    map[string]bool
}

func (s *scope) cteVisible(name string) bool {
	for sc := s; sc != nil; sc = sc.parent {
		if sc.ctes[name] {
			return true
		}
	}
	return false
}

// colKey identifies a column of a relRef within one scope.
type colKey struct {
	rel *relRef
	col string
}

// analysis accumulates the result of analyzing one statement.
type analysis struct {
	schema *Schema
	refs   []*relRef
	// uncacheable reasons found while walking (first one wins for reporting).
	uncacheable []string
	rewrite     string
	// clock: the statement reads the transaction's start (now(),
	// CURRENT_DATE, …), which a client fixes to a clock bucket (clock.go).
	clock bool
	depth int
	// outputNames are the select lists' aliases anywhere in the statement
	// (ORDER BY and GROUP BY may name them); nil until first needed.
	root        proto.Message
	outputNames map[string]bool
	// sql and numParams are the statement's text and its highest
	// parameter (RowSplit.Repair rewrites the text).
	sql       string
	numParams int
}

// isOutputName reports whether name is a select-list alias of the
// statement.
func (a *analysis) isOutputName(name string) bool {
	if a.outputNames == nil {
		a.outputNames = map[string]bool{}
		if a.root != nil {
			walk(a.root, func(m proto.Message) bool {
				if rt, ok := m.(*pg.ResTarget); ok && rt.GetName() != "" {
					a.outputNames[rt.GetName()] = true
				}
				return true
			})
		}
	}
	return a.outputNames[name]
}

const maxDepth = 64 // nesting of subqueries and views; deeper is refused, never a stack overflow

func (a *analysis) refuse(format string, args ...any) {
	a.uncacheable = append(a.uncacheable, fmt.Sprintf(format, args...))
}

// selectStmt analyzes a SELECT (or set operation) with the given enclosing scope.
func (a *analysis) selectStmt(st *pg.SelectStmt, parent *scope) {
	if st == nil {
		return
	}
	a.depth++
	defer func() { a.depth-- }()
	if a.depth > maxDepth {
		a.refuse("nested more than %d levels deep", maxDepth)
		return
	}
	sc := &scope{parent: parent, opaque: map[string]bool{}, ctes: map[string]bool{}}
	if w := st.GetWithClause(); w != nil {
		for _, c := range w.GetCtes() {
			cte := c.GetCommonTableExpr()
			if cte == nil {
				continue
			}
			if w.GetRecursive() {
				sc.ctes[cte.GetCtename()] = true
			}
			a.statementIn(cte.GetCtequery(), sc)
			sc.ctes[cte.GetCtename()] = true
		}
	}
	if st.GetOp() != pg.SetOperation_SETOP_NONE && st.GetOp() != pg.SetOperation_SET_OPERATION_UNDEFINED {
		a.selectStmt(st.GetLarg(), sc)
		a.selectStmt(st.GetRarg(), sc)
		// ORDER BY / LIMIT of a set operation name output columns; walk them for subqueries.
		a.walkExprs(sc, append(append([]*pg.Node{}, st.GetSortClause()...), st.GetLimitCount(), st.GetLimitOffset()))
		return
	}
	if len(st.GetLockingClause()) > 0 {
		a.refuse("FOR UPDATE/SHARE locks rows")
	}
	if st.GetIntoClause() != nil {
		a.refuse("SELECT INTO writes a table")
	}

	var conj []*pg.Node // filtering conjuncts: WHERE and inner joins' ON
	type onConj struct {
		conds []*pg.Node
		rels  map[*relRef]bool // the nullable side it may bind
	}
	var outerOn []onConj
	var exprs []*pg.Node // everything whose columns are read

	var fromItem func(n *pg.Node) []*relRef
	fromItem = func(n *pg.Node) []*relRef {
		switch {
		case n.GetRangeVar() != nil:
			return a.rangeVar(n.GetRangeVar(), sc)
		case n.GetJoinExpr() != nil:
			j := n.GetJoinExpr()
			left := fromItem(j.GetLarg())
			right := fromItem(j.GetRarg())
			exprs = append(exprs, j.GetQuals())
			all := append(append([]*relRef{}, left...), right...)
			using := j.GetUsingClause()
			if j.GetIsNatural() {
				using = nil
				for _, c := range naturalColumns(left, right) {
					using = append(using, pg.MakeStrNode(c))
				}
				if hasUnknown(left) || hasUnknown(right) {
					for _, r := range all {
						r.all = true
					}
				}
			}
			for _, u := range using {
				col := u.GetString_().GetSval()
				for _, r := range all {
					if r.table == nil || r.table.Column(col) != nil {
						r.read(col)
					}
				}
			}
			switch j.GetJointype() {
			case pg.JoinType_JOIN_INNER:
				conj = append(conj, flattenAnd(j.GetQuals())...)
				conj = append(conj, usingEqualities(using, left, right)...)
			case pg.JoinType_JOIN_LEFT:
				markNullable(right)
				outerOn = append(outerOn, onConj{flattenAnd(j.GetQuals()), relSet(right)})
			case pg.JoinType_JOIN_RIGHT:
				markNullable(left)
				outerOn = append(outerOn, onConj{flattenAnd(j.GetQuals()), relSet(left)})
			default: // FULL: neither side is filtered by ON
				markNullable(all)
			}
			if al := j.GetAlias(); al != nil {
				sc.opaque[al.GetAliasname()] = true
			}
			return all
		case n.GetRangeSubselect() != nil:
			rs := n.GetRangeSubselect()
			a.statementIn(rs.GetSubquery(), sc)
			if al := rs.GetAlias(); al != nil {
				sc.opaque[al.GetAliasname()] = true
			}
			sc.anyOpaq = true
			return nil
		case n.GetRangeFunction() != nil:
			rf := n.GetRangeFunction()
			exprs = append(exprs, rf.GetFunctions()...)
			if al := rf.GetAlias(); al != nil {
				sc.opaque[al.GetAliasname()] = true
			}
			sc.anyOpaq = true
			return nil
		default:
			// TABLESAMPLE, XMLTABLE, JSON_TABLE and the like: walk their
			// expressions and treat their output as opaque.
			exprs = append(exprs, n)
			sc.anyOpaq = true
			return nil
		}
	}
	for _, f := range st.GetFromClause() {
		fromItem(f)
	}

	conj = append(conj, flattenAnd(st.GetWhereClause())...)
	exprs = append(exprs, st.GetTargetList()...)
	exprs = append(exprs, st.GetWhereClause(), st.GetHavingClause(), st.GetLimitCount(), st.GetLimitOffset())
	exprs = append(exprs, st.GetGroupClause()...)
	exprs = append(exprs, st.GetSortClause()...)
	exprs = append(exprs, st.GetWindowClause()...)
	exprs = append(exprs, st.GetDistinctClause()...)
	exprs = append(exprs, st.GetValuesLists()...)
	a.walkExprs(sc, exprs)

	// Bindings and equalities from the filtering conjuncts, closed under equality.
	uf := newUnionFind()
	binds := map[colKey][]valueSource{}
	for _, c := range conj {
		a.conjunct(c, sc, uf, binds, nil)
	}
	for _, oc := range outerOn {
		// An outer join's ON filters only its nullable side, and equalities in
		// it are not closed over: bind direct col = value on that side only.
		a.conjunct2(oc.conds, sc, oc.rels)
	}
	classBinds := map[colKey][]valueSource{}
	for k, v := range binds {
		root := uf.find(k)
		if have, ok := classBinds[root]; !ok || len(v) < len(have) {
			classBinds[root] = v
		}
	}
	for _, k := range uf.keys() {
		if v, ok := classBinds[uf.find(k)]; ok {
			if k.rel.bound == nil {
				k.rel.bound = map[string][]valueSource{}
			}
			if have, ok := k.rel.bound[k.col]; !ok || len(v) < len(have) {
				k.rel.bound[k.col] = v
			}
		}
	}
	deriveColumns(sc, uf)
	if len(sc.rels) > 0 && len(conj) == 0 && len(outerOn) == 0 {
		for _, r := range sc.rels {
			r.note("no predicate restricts it")
		}
	}
	if parent == nil && a.depth == 1 {
		a.splitRows(st, sc)
	}
}

// deriveColumns binds derived columns: when an inner equality joins a
// reference's column fk to another reference's single-column primary key,
// every column c bound on the other reference binds, on the first, the
// derived column fk->table.c to the same values (each row joins the one row
// the key names, whose c must have one of them). Only between references of
// this scope with known tables, neither on the nullable side of an outer
// join.
func deriveColumns(sc *scope, uf *unionFind) {
	if sc.anyOpaq || hasUnknown(sc.rels) {
		return
	}
	keys := uf.keys()
	for _, ka := range keys {
		for _, kb := range keys {
			if ka.rel != kb.rel && uf.find(ka) == uf.find(kb) {
				deriveThrough(ka.rel, ka.col, kb.rel, kb.col)
			}
		}
	}
}

// deriveThrough binds on a the derived columns through b, when a.fk = b.pk
// joins a row of a to at most one row of b: pk is b's single-column primary
// key, of the same keyable type as fk. Nothing is derived when fk is bound
// to values itself (its plain keys serve), nor b's key itself (fk carries
// it), nor b's own derived columns.
func deriveThrough(a *relRef, fk string, b *relRef, pk string) {
	if a.nullable || b.nullable || len(b.table.PrimaryKey) != 1 || b.table.PrimaryKey[0] != pk {
		return
	}
	fkCol, pkCol := a.table.Column(fk), b.table.Column(pk)
	if fkCol == nil || pkCol == nil || fkCol.Type != pkCol.Type || !Keyable(pkCol.Type) {
		return
	}
	if _, bound := a.bound[fk]; bound {
		return
	}
	for c, alts := range b.bound {
		col := b.table.Column(c)
		if c == pk || col == nil || !Keyable(col.Type) || slices.ContainsFunc(alts, func(v valueSource) bool { return v.IsNull }) {
			continue
		}
		if a.derived == nil {
			a.derived = map[string]derivation{}
		}
		if a.bound == nil {
			a.bound = map[string][]valueSource{}
		}
		name := tags.DerivedColumn(fk, b.name, c)
		a.bound[name] = alts
		a.derived[name] = derivation{through: b, fk: fk, col: c, typ: col.Type}
	}
}

func (a *analysis) conjunct2(conds []*pg.Node, sc *scope, allowed map[*relRef]bool) {
	binds := map[colKey][]valueSource{}
	for _, c := range conds {
		a.conjunct(c, sc, nil, binds, allowed)
	}
	for k, v := range binds {
		if k.rel.bound == nil {
			k.rel.bound = map[string][]valueSource{}
		}
		k.rel.bound[k.col] = v
	}
}

// conjunct extracts a binding (col = value) or an equality (col = col) from
// one conjunct. Anything else is noted on the tables it mentions.
func (a *analysis) conjunct(c *pg.Node, sc *scope, uf *unionFind, binds map[colKey][]valueSource, allowed map[*relRef]bool) {
	ok := func(k colKey) bool { return k.rel != nil && (allowed == nil || allowed[k.rel]) }
	if e := c.GetAExpr(); e != nil && (opName(e) == "=" || breakRangesForTest && isRange(opName(e))) {
		switch e.GetKind() {
		case pg.A_Expr_Kind_AEXPR_OP:
			lk, lcol := a.bindableColumn(e.GetLexpr(), sc)
			rk, rcol := a.bindableColumn(e.GetRexpr(), sc)
			switch {
			case lcol && rcol:
				if uf != nil && ok(lk) && ok(rk) {
					uf.union(lk, rk)
					return
				}
			case lcol:
				if v, isVal := valueOf(e.GetRexpr()); isVal && ok(lk) && castFits(lk, e.GetRexpr()) {
					binds[lk] = []valueSource{v}
					return
				}
			case rcol:
				if v, isVal := valueOf(e.GetLexpr()); isVal && ok(rk) && castFits(rk, e.GetLexpr()) {
					binds[rk] = []valueSource{v}
					return
				}
			}
		case pg.A_Expr_Kind_AEXPR_IN:
			if k, isCol := a.bindableColumn(e.GetLexpr(), sc); isCol && ok(k) {
				if alts := listValues(k, e.GetRexpr().GetList().GetItems()); len(alts) > 0 {
					binds[k] = alts
					return
				}
			}
		case pg.A_Expr_Kind_AEXPR_OP_ANY:
			if k, isCol := a.bindableColumn(e.GetLexpr(), sc); isCol && ok(k) {
				r := stripCast(e.GetRexpr())
				if p := r.GetParamRef(); p != nil && castFits(k, e.GetRexpr()) {
					binds[k] = []valueSource{{Param: int(p.GetNumber()), Array: true}}
					return
				}
				if arr := r.GetAArrayExpr(); arr != nil {
					if alts := listValues(k, arr.GetElements()); len(alts) > 0 {
						binds[k] = alts
						return
					}
				}
			}
		}
	}
	// Not understood: say why, on every table it mentions.
	why := describe(c)
	a.columnsIn(c, sc, func(r *relRef, col string) {
		r.note("%s on %s", why, col)
	})
}

// breakRangesForTest makes the analysis unsound on purpose (a range taken
// for an equality) so that the soundness test can prove it catches a broken
// analyzer. Only tests set it.
var breakRangesForTest = false

func isRange(op string) bool { return op == "<" || op == "<=" || op == ">" || op == ">=" }

// describe names the kind of a predicate the analysis does not turn into keys.
func describe(c *pg.Node) string {
	if b := c.GetBoolExpr(); b != nil {
		switch b.GetBoolop() {
		case pg.BoolExprType_OR_EXPR:
			return "OR"
		case pg.BoolExprType_NOT_EXPR:
			return "NOT"
		}
	}
	if e := c.GetAExpr(); e != nil {
		switch e.GetKind() {
		case pg.A_Expr_Kind_AEXPR_LIKE, pg.A_Expr_Kind_AEXPR_ILIKE, pg.A_Expr_Kind_AEXPR_SIMILAR:
			return "pattern match"
		case pg.A_Expr_Kind_AEXPR_BETWEEN, pg.A_Expr_Kind_AEXPR_NOT_BETWEEN, pg.A_Expr_Kind_AEXPR_BETWEEN_SYM, pg.A_Expr_Kind_AEXPR_NOT_BETWEEN_SYM:
			return "range"
		case pg.A_Expr_Kind_AEXPR_IN:
			return "IN list that is not all values"
		}
		switch opName(e) {
		case "<", "<=", ">", ">=":
			return "range"
		case "<>", "!=":
			return "inequality"
		case "=":
			return "equality that is not column = value (a function or cast of a column, or an outer column)"
		}
		return "operator " + opName(e)
	}
	if c.GetSubLink() != nil {
		return "subquery"
	}
	if c.GetNullTest() != nil {
		return "IS NULL test"
	}
	if c.GetFuncCall() != nil {
		return "function"
	}
	return "predicate"
}

func opName(e *pg.A_Expr) string {
	names := e.GetName()
	if len(names) == 0 {
		return ""
	}
	return names[len(names)-1].GetString_().GetSval()
}

// stripCast removes type casts around a value (not around a column).
func stripCast(n *pg.Node) *pg.Node {
	for n.GetTypeCast() != nil {
		n = n.GetTypeCast().GetArg()
	}
	return n
}

// castFamilies maps a type name, as a cast may spell it, to the family whose
// equality is the same as the column type's. A value cast to another family
// would make PostgreSQL compare in that type (a bpchar cast ignores trailing
// spaces, a numeric cast compares 42 and 42.0 equal), and the value's text
// would no longer identify the rows it matches.
var castFamilies = map[string]string{
	"int2": "int", "int4": "int", "int8": "int", "smallint": "int", "integer": "int", "int": "int", "bigint": "int", "oid": "int",
	"text": "text", "varchar": "text", "name": "text",
	"bool": "bool", "boolean": "bool",
	"uuid": "uuid",
}

// castFits reports whether every cast around value n keeps the comparison in
// the column's own type family (an uncast value takes the column's type).
func castFits(k colKey, n *pg.Node) bool {
	col := k.rel.table.Column(k.col)
	if col == nil {
		return false
	}
	want := castFamilies[col.Type]
	for tc := n.GetTypeCast(); tc != nil; tc = n.GetTypeCast() {
		names := tc.GetTypeName().GetNames()
		if len(names) == 0 || len(tc.GetTypeName().GetTypmods()) > 0 {
			return false // a typmod such as varchar(5) truncates the value
		}
		typ := strings.ToLower(names[len(names)-1].GetString_().GetSval())
		if fam := castFamilies[typ]; fam == "" || fam != want {
			return false
		}
		n = tc.GetArg()
	}
	return true
}

// valueOf recognizes a parameter or literal, possibly cast.
// listValues returns the values of an IN list or ARRAY[...] bound to k,
// or nil when any item is not a parameter or literal that fits k.
func listValues(k colKey, items []*pg.Node) []valueSource {
	var alts []valueSource
	for _, item := range items {
		v, isVal := valueOf(item)
		if !isVal || !castFits(k, item) {
			return nil
		}
		alts = append(alts, v)
	}
	return alts
}

func valueOf(n *pg.Node) (valueSource, bool) {
	n = stripCast(n)
	if p := n.GetParamRef(); p != nil {
		return valueSource{Param: int(p.GetNumber())}, p.GetNumber() > 0
	}
	c := n.GetAConst()
	if c == nil {
		return valueSource{}, false
	}
	switch {
	case c.GetIsnull():
		return valueSource{IsNull: true}, true
	case c.GetIval() != nil:
		return valueSource{Literal: strconv.FormatInt(int64(c.GetIval().GetIval()), 10)}, true
	case c.GetSval() != nil:
		return valueSource{Literal: c.GetSval().GetSval()}, true
	case c.GetFval() != nil:
		return valueSource{Literal: c.GetFval().GetFval()}, true
	case c.GetBoolval() != nil:
		if c.GetBoolval().GetBoolval() {
			return valueSource{Literal: "t"}, true
		}
		return valueSource{Literal: "f"}, true
	}
	return valueSource{}, false
}

// bindableColumn resolves n to a base-table column of this very scope,
// unambiguously; a cast or function of a column is not one.
func (a *analysis) bindableColumn(n *pg.Node, sc *scope) (colKey, bool) {
	cr := n.GetColumnRef()
	if cr == nil {
		return colKey{}, false
	}
	fields := fieldNames(cr)
	if fields == nil {
		return colKey{}, false
	}
	switch len(fields) {
	case 1:
		var found *relRef
		for _, r := range sc.rels {
			if r.table != nil && r.table.Column(fields[0]) != nil {
				if found != nil {
					return colKey{}, false // ambiguous
				}
				found = r
			}
			if r.table == nil {
				return colKey{}, false // an unknown table could own it
			}
		}
		if found == nil || sc.anyOpaq {
			return colKey{}, false
		}
		return colKey{found, fields[0]}, true
	default:
		qual, col := fields[len(fields)-2], fields[len(fields)-1]
		for _, r := range sc.rels {
			if r.alias == qual && r.table != nil && r.table.Column(col) != nil {
				return colKey{r, col}, true
			}
		}
	}
	return colKey{}, false
}

// fieldNames returns a ColumnRef's names; "*" for a star; nil if odd.
func fieldNames(cr *pg.ColumnRef) []string {
	out := make([]string, 0, len(cr.GetFields()))
	for _, f := range cr.GetFields() {
		switch {
		case f.GetString_() != nil:
			out = append(out, f.GetString_().GetSval())
		case f.GetAStar() != nil:
			out = append(out, "*")
		default:
			return nil
		}
	}
	return out
}

// rangeVar adds a table (or expands a view, or notes a CTE reference).
func (a *analysis) rangeVar(rv *pg.RangeVar, sc *scope) []*relRef {
	alias := rv.GetRelname()
	if al := rv.GetAlias(); al != nil {
		alias = al.GetAliasname()
	}
	if rv.GetSchemaname() == "" && sc.cteVisible(rv.GetRelname()) {
		sc.opaque[alias] = true
		sc.anyOpaq = true
		return nil
	}
	if rv.GetRelpersistence() == "t" || rv.GetSchemaname() == "pg_temp" {
		a.refuse("reads temporary table %s", rv.GetRelname())
	}
	qualified, table, view := a.schema.Resolve(rv.GetSchemaname(), rv.GetRelname())
	if view != nil {
		a.view(view)
		sc.opaque[alias] = true
		sc.anyOpaq = true
		return nil
	}
	if table == nil {
		a.refuse("unknown table %s (not in the schema; it may be temporary)", qualified)
	} else if table.Temporary {
		a.refuse("reads temporary table %s", qualified)
	}
	r := &relRef{alias: alias, name: qualified, table: table, reads: map[string]bool{}, all: table == nil}
	sc.rels = append(sc.rels, r)
	a.refs = append(a.refs, r)
	return []*relRef{r}
}

// view analyzes a view's query as a scope of its own: predicates outside it
// do not reach its tables, which therefore mostly get table tags.
func (a *analysis) view(v *View) {
	res, err := pg.Parse(v.Query)
	if err != nil || len(res.GetStmts()) != 1 {
		a.refuse("view %s: its query cannot be analyzed", v.Name)
		return
	}
	a.depth++
	defer func() { a.depth-- }()
	if a.depth > maxDepth {
		a.refuse("views nested more than %d levels deep", maxDepth)
		return
	}
	before := len(a.refs)
	body := res.GetStmts()[0].GetStmt()
	a.statementIn(body, nil)
	for _, r := range a.refs[before:] {
		r.note("read through view %s", v.Name)
	}
	// What the view's query calls counts as the statement's own; a clock
	// read inside it cannot be fixed to a bucket (the text is the view's).
	va := &analysis{schema: a.schema, root: body}
	va.checkCacheable(body)
	for _, why := range va.uncacheable {
		a.refuse("view %s %s", v.Name, why)
	}
	if va.clock {
		a.refuse("view %s reads the clock (now()/CURRENT_DATE… in a view cannot be fixed to a clock bucket)", v.Name)
		a.rewrite = timeRewrite
	}
}

// statementIn analyzes a nested statement (subquery, CTE body, view query).
func (a *analysis) statementIn(n *pg.Node, parent *scope) {
	switch {
	case n == nil:
	case n.GetSelectStmt() != nil:
		a.selectStmt(n.GetSelectStmt(), parent)
	case n.GetInsertStmt() != nil, n.GetUpdateStmt() != nil, n.GetDeleteStmt() != nil, n.GetMergeStmt() != nil:
		a.refuse("a data-modifying statement inside the query writes")
	default:
		a.refuse("nested statement of an unsupported kind")
	}
}

// walkExprs records the columns read by exprs and analyzes subqueries in them.
func (a *analysis) walkExprs(sc *scope, exprs []*pg.Node) {
	for _, e := range exprs {
		if e == nil {
			continue
		}
		walk(e, func(m proto.Message) bool {
			switch x := m.(type) {
			case *pg.SubLink:
				a.walkExprs(sc, []*pg.Node{x.GetTestexpr()})
				a.statementIn(x.GetSubselect(), sc)
				return false
			case *pg.SelectStmt:
				a.selectStmt(x, sc)
				return false
			case *pg.ColumnRef:
				a.resolveRead(x, sc)
				return false
			}
			return true
		})
	}
}

// columnsIn calls fn for each base-table column of this scope mentioned in n.
func (a *analysis) columnsIn(n *pg.Node, sc *scope, fn func(*relRef, string)) {
	walk(n, func(m proto.Message) bool {
		switch x := m.(type) {
		case *pg.SubLink, *pg.SelectStmt:
			return false
		case *pg.ColumnRef:
			fields := fieldNames(x)
			if len(fields) == 0 {
				return false
			}
			col := fields[len(fields)-1]
			for _, r := range sc.rels {
				if len(fields) == 1 && (r.table == nil || r.table.Column(col) != nil) ||
					len(fields) > 1 && r.alias == fields[len(fields)-2] {
					fn(r, col)
				}
			}
			return false
		}
		return true
	})
}

// resolveRead adds a column reference to the reads of every table it may
// belong to, erring towards more reads (which is always sound).
func (a *analysis) resolveRead(cr *pg.ColumnRef, sc *scope) {
	fields := fieldNames(cr)
	if len(fields) == 0 {
		for s := sc; s != nil; s = s.parent {
			for _, r := range s.rels {
				r.all = true
			}
		}
		return
	}
	last := fields[len(fields)-1]
	if len(fields) == 1 && last == "*" {
		for _, r := range sc.rels {
			r.all = true
		}
		return
	}
	if len(fields) >= 2 {
		qual := fields[len(fields)-2]
		for s := sc; s != nil; s = s.parent {
			matched := false
			for _, r := range s.rels {
				if r.alias == qual || r.name == qual || (len(fields) >= 3 && r.name == fields[len(fields)-3]+"."+qual) {
					matched = true
					if last == "*" {
						r.all = true
					} else {
						if r.table != nil && r.table.Column(last) == nil {
							// PostgreSQL would refuse it, or read a function
							// in attribute notation: nothing to cache.
							a.refuse("unknown column %s.%s", qual, last)
						}
						r.read(last)
					}
				}
			}
			if matched || s.opaque[qual] {
				return
			}
		}
		// Unknown qualifier: a composite field access or an error; be safe.
		for s := sc; s != nil; s = s.parent {
			for _, r := range s.rels {
				r.all = true
			}
		}
		return
	}
	// Unqualified: the innermost scope whose tables have the column, and
	// every outer one too when the inner scope has opaque sources.
	for s := sc; s != nil; s = s.parent {
		matched := false
		for _, r := range s.rels {
			if r.table == nil {
				matched = true // an unknown table reads everything already
				continue
			}
			if r.table.Column(last) != nil {
				r.read(last)
				matched = true
			}
		}
		if matched && !s.anyOpaq {
			return
		}
		for _, r := range s.rels {
			if r.alias == last && !matched {
				r.all = true // whole-row reference: SELECT t FROM items t
				return
			}
		}
	}
	// No table of any scope has the column: a select-list alias, or a
	// column the schema does not know (then the schema is older than
	// the query, or the query fails): nothing to cache.
	if !a.isOutputName(last) && !anyOpaque(sc) {
		a.refuse("unknown column %s", last)
	}
}

// anyOpaque reports whether sc or a scope around it has sources whose
// columns are not known (functions, VALUES, unknown tables).
func anyOpaque(sc *scope) bool {
	for s := sc; s != nil; s = s.parent {
		if s.anyOpaq || hasUnknown(s.rels) {
			return true
		}
	}
	return false
}

func hasUnknown(rs []*relRef) bool {
	for _, r := range rs {
		if r.table == nil {
			return true
		}
	}
	return false
}

func markNullable(rs []*relRef) {
	for _, r := range rs {
		r.nullable = true
	}
}

func relSet(rs []*relRef) map[*relRef]bool {
	m := make(map[*relRef]bool, len(rs))
	for _, r := range rs {
		m[r] = true
	}
	return m
}

// naturalColumns are the column names both sides of a NATURAL join have.
func naturalColumns(left, right []*relRef) []string {
	in := func(rs []*relRef) map[string]bool {
		m := map[string]bool{}
		for _, r := range rs {
			if r.table != nil {
				for _, c := range r.table.Columns {
					m[c.Name] = true
				}
			}
		}
		return m
	}
	l, r := in(left), in(right)
	var out []string
	for c := range l {
		if r[c] {
			out = append(out, c)
		}
	}
	sort.Strings(out)
	return out
}

// usingEqualities turns JOIN ... USING (c) into l.c = r.c conjuncts when each
// side has exactly one table with the column.
func usingEqualities(using []*pg.Node, left, right []*relRef) []*pg.Node {
	var out []*pg.Node
	one := func(rs []*relRef, col string) *relRef {
		var found *relRef
		for _, r := range rs {
			if r.table != nil && r.table.Column(col) != nil {
				if found != nil {
					return nil
				}
				found = r
			}
		}
		return found
	}
	for _, u := range using {
		col := u.GetString_().GetSval()
		l, r := one(left, col), one(right, col)
		if l == nil || r == nil {
			continue
		}
		out = append(out, pg.MakeAExprNode(pg.A_Expr_Kind_AEXPR_OP, []*pg.Node{pg.MakeStrNode("=")},
			pg.MakeColumnRefNode([]*pg.Node{pg.MakeStrNode(l.alias), pg.MakeStrNode(col)}, -1),
			pg.MakeColumnRefNode([]*pg.Node{pg.MakeStrNode(r.alias), pg.MakeStrNode(col)}, -1), -1))
	}
	return out
}

// flattenAnd returns the conjuncts of an AND tree.
func flattenAnd(n *pg.Node) []*pg.Node {
	if n == nil {
		return nil
	}
	if b := n.GetBoolExpr(); b != nil && b.GetBoolop() == pg.BoolExprType_AND_EXPR {
		var out []*pg.Node
		for _, arg := range b.GetArgs() {
			out = append(out, flattenAnd(arg)...)
		}
		return out
	}
	return []*pg.Node{n}
}

// walk visits every message under m in depth-first order; fn returns false to
// skip a message's children.
func walk(m proto.Message, fn func(proto.Message) bool) {
	if m == nil {
		return
	}
	rm := m.ProtoReflect()
	if !rm.IsValid() {
		return
	}
	if _, isNode := m.(*pg.Node); !isNode && !fn(m) {
		return
	}
	rm.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		if fd.Kind() != protoreflect.MessageKind && fd.Kind() != protoreflect.GroupKind {
			return true
		}
		switch {
		case fd.IsList():
			l := v.List()
			for i := 0; i < l.Len(); i++ {
				walk(l.Get(i).Message().Interface(), fn)
			}
		case fd.IsMap():
		default:
			walk(v.Message().Interface(), fn)
		}
		return true
	})
}

// unionFind groups columns made equal by join predicates.
type unionFind struct {
	parent map[colKey]colKey
	order  []colKey
}

func newUnionFind() *unionFind { return &unionFind{parent: map[colKey]colKey{}} }

func (u *unionFind) find(k colKey) colKey {
	p, ok := u.parent[k]
	if !ok {
		u.parent[k] = k
		u.order = append(u.order, k)
		return k
	}
	if p == k {
		return k
	}
	r := u.find(p)
	u.parent[k] = r
	return r
}

func (u *unionFind) union(a, b colKey) {
	ra, rb := u.find(a), u.find(b)
	if ra != rb {
		u.parent[ra] = rb
	}
}

func (u *unionFind) keys() []colKey { return u.order }
