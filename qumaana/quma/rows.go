package quma

import (
	"fmt"
	"slices"
	"sort"
	"strings"

	"github.com/jackc/pgx/v5"
	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

// RowSplit narrows a query's dependency on one table to the rows of its
// result. A query such as
//
//	SELECT id, name, max_bid FROM items WHERE category = $1 ORDER BY end_date LIMIT 20
//
// depends on two things of items: which rows it holds and in what order,
// decided by the membership columns (category, end_date, and the key id),
// and what it shows of each row it holds (name, max_bid), which changes
// only when one of those rows changes. Keyed on items(category) reading
// every column, every bid on any item of the category would invalidate
// it. Split, its category tag reads only the membership columns, and each
// row it holds adds a tag items(id)=… reading the display columns: a bid
// on an item it does not show leaves it valid.
//
// The split is sound because a change that leaves a row's membership
// columns alone cannot make it enter or leave the result nor move it (an
// INSERT, a DELETE or an UPDATE of a membership column hits the group
// tag), and a change to a display column of a row the result holds hits
// that row's tag. Ties in the ordering are broken arbitrarily by
// PostgreSQL, at any snapshot, so the result stays one of the answers
// PostgreSQL may give.
//
// A query splits only in its simplest form, where every output column is a
// plain column of one table or a star (*, t.*): one SELECT over tables
// each named once, joined by inner joins (ON or WHERE), with no subquery,
// grouping, aggregate, DISTINCT, window, set operation, locking, system
// column, whole-row reference or output column named by ORDER BY position
// or alias; the table's primary key is a single integer column among the
// outputs, and a tag column set of its own (Dep.Rows is set in buildDeps
// only then). A star is expanded to the columns the analysis knows; a
// client splits a result only when its columns are named as Outputs says,
// so a column added since is noticed.
type RowSplit struct {
	// Output is the result column that holds KeyColumn, and OutputName
	// its name (the column's, or its alias), which a client checks
	// against the result's before it trusts the column.
	Output     int
	OutputName string
	// Outputs are the names of every result column, as the statement
	// gives them (a star expanded to the columns the analysis knows); a
	// result whose columns are named otherwise (a column added since) is
	// not split.
	Outputs []string
	// KeyColumn is the table's primary key, an integer column.
	KeyColumn string
	// KeyType is its type (int2, int4 or int8).
	KeyType string
	// Membership are the columns that decide which rows the result holds
	// and their order, with the key; Display the columns it only shows.
	// Both sorted; together they are the dependency's Reads.
	Membership []string
	Display    []string
	// Fetch, set when every output column is a column of this table,
	// reads the rows of a result again by key, their outputs in order:
	// SELECT <the outputs' columns> FROM <table> WHERE <key> = ANY($1),
	// $1 an array of keys. A client that still holds which rows a result
	// holds (its membership, valid) but not what it shows of them (a row
	// it shows changed) patches the result with it instead of running the
	// query again.
	Fetch string
	// Carry, when set, says that a membership found for one value of a
	// lower bound holds for a higher one too, once its rows are read
	// again with the higher bound (see Carry).
	Carry *Carry
	// Repair, when set, says how a membership brought up to date by the
	// changes of some of the table's rows is read (see Repair).
	Repair *Repair
}

// Repair describes how a membership whose group changed only through
// rows the invalidation names (invalidation.Change.Keys) is brought up to
// date without the query: the statement runs on those rows and the
// membership's, its WHERE narrowed to them by key. The query's rows at
// the new snapshot are among them, but for rows it had left out past
// its LIMIT: with a LIMIT, the result is the query's only when it is full
// and its last row sorts no later than the membership's last (every row
// left out sorted no earlier than that one, and still does, unchanged).
type Repair struct {
	// SQL is the statement with "AND <ref>.<key> = ANY($KeyParam)" in its
	// WHERE, KeyParam one past its last parameter, and without its LIMIT
	// when that is a literal (a LIMIT parameter stays: run with the number
	// of keys, it leaves out nothing).
	SQL      string
	KeyParam int
	// Wide is the statement with its LIMIT read from parameter WideParam:
	// the LIMIT's own parameter, or one past the last when the LIMIT is a
	// literal (empty without a LIMIT). Run with a LIMIT wider than the
	// read's, its first rows are the read's result, and the membership
	// keeps them all: rows that leave it are then repaired too, as long as
	// the rows left before its last still fill the read's LIMIT.
	Wide      string
	WideParam int
	// Limit is the LIMIT's literal count, LimitParam its parameter
	// (1-based); both 0 without a LIMIT.
	Limit, LimitParam int
	// Offset is the offset's parameter, which must be 0 at run time (0
	// when the statement has none, or a literal 0).
	Offset int
	// SortOutput is the output holding the statement's one ORDER BY
	// column, ascending (-1 without a LIMIT).
	SortOutput int
}

// Carry describes a query whose rows start at a lower bound given as a
// parameter: "WHERE … AND end_date >= $3 ORDER BY end_date LIMIT 20",
// with no offset (or an offset parameter that is 0). Its membership for a
// bound v holds for any bound w >= v at the same snapshot when every row
// it holds still has end_date >= w: a row the higher bound leaves out
// has end_date < w, below every row the membership holds, so it would
// have been among them. A page keyed on a clock rounded to the minute
// is then not run again every minute, only its rows read again by key.
type Carry struct {
	// Param is the bound's parameter (1-based); it appears once in the
	// statement.
	Param int
	// Offset is the offset's parameter (1-based), which must be 0 at
	// run time for the membership to be carried; 0 when the statement
	// has no offset (or a literal 0).
	Offset int
	// Fetch is RowSplit.Fetch with the bound: "… WHERE <key> = ANY($1)
	// AND <column> >= $2" ($2 the bound; > when the statement's is).
	Fetch string
}

// splitRows sets the RowSplit of each table of st (the statement's top
// SELECT, whose scope is sc) that can be split.
func (a *analysis) splitRows(st *pg.SelectStmt, sc *scope) {
	if st.GetWithClause() != nil || len(st.GetGroupClause()) > 0 || st.GetHavingClause() != nil ||
		len(st.GetDistinctClause()) > 0 || len(st.GetWindowClause()) > 0 || len(st.GetLockingClause()) > 0 ||
		len(st.GetValuesLists()) > 0 || st.GetIntoClause() != nil || st.GetGroupDistinct() {
		return
	}
	if sc.anyOpaq || len(sc.opaque) > 0 || len(a.refs) != len(sc.rels) || len(sc.rels) == 0 {
		return // a subquery, a view, a function or a join alias
	}
	names := map[string]bool{}
	for _, r := range sc.rels {
		if r.table == nil || r.nullable || names[r.name] {
			return
		}
		names[r.name] = true
	}
	nested := false
	walk(st, func(m proto.Message) bool {
		switch x := m.(type) {
		case *pg.SubLink:
			nested = true
		case *pg.SelectStmt:
			nested = nested || x != st
		}
		return !nested
	})
	if nested {
		return
	}
	var quals []*pg.Node // join conditions
	var innerOnly func(n *pg.Node) bool
	innerOnly = func(n *pg.Node) bool {
		switch {
		case n.GetRangeVar() != nil:
			return true
		case n.GetJoinExpr() != nil:
			j := n.GetJoinExpr()
			if j.GetJointype() != pg.JoinType_JOIN_INNER || j.GetIsNatural() || len(j.GetUsingClause()) > 0 || j.GetAlias() != nil {
				return false
			}
			quals = append(quals, j.GetQuals())
			return innerOnly(j.GetLarg()) && innerOnly(j.GetRarg())
		}
		return false
	}
	for _, f := range st.GetFromClause() {
		if !innerOnly(f) {
			return
		}
	}
	// The outputs: each a plain column of one table.
	type output struct {
		rel  *relRef
		col  string
		name string
	}
	var outputs []output
	aliases := map[string]bool{}
	for _, t := range st.GetTargetList() {
		rt := t.GetResTarget()
		if rt == nil {
			return
		}
		if rt.GetName() != "" {
			aliases[rt.GetName()] = true
		}
		cr := rt.GetVal().GetColumnRef()
		if cr == nil {
			return
		}
		if stars := starRels(cr, sc); stars != nil {
			// SELECT *, t.*: the tables' columns in order, as PostgreSQL
			// expands them (a client checks the result's names against
			// the expansion, so a column added since is noticed).
			for _, r := range stars {
				for _, c := range r.table.Columns {
					outputs = append(outputs, output{r, c.Name, c.Name})
				}
			}
			continue
		}
		r, col := a.outputColumn(cr, sc)
		if r == nil {
			return
		}
		name := col
		if rt.GetName() != "" {
			name = rt.GetName()
		}
		outputs = append(outputs, output{r, col, name})
	}
	outputNames := make([]string, len(outputs))
	for i, o := range outputs {
		outputNames[i] = o.name
	}
	// Membership: every column the rest of the statement mentions.
	member := map[*relRef]map[string]bool{}
	for _, r := range sc.rels {
		member[r] = map[string]bool{}
	}
	rest := append([]*pg.Node{st.GetWhereClause(), st.GetLimitCount(), st.GetLimitOffset()}, quals...)
	for _, s := range st.GetSortClause() {
		n := s.GetSortBy().GetNode()
		if c := stripCast(n); c.GetAConst() != nil {
			return // ORDER BY 2: an output by position
		}
		if cr := n.GetColumnRef(); cr != nil {
			if f := fieldNames(cr); len(f) == 1 && aliases[f[0]] {
				return // ORDER BY an output's alias
			}
		}
		rest = append(rest, n)
	}
	for _, n := range rest {
		if n == nil {
			continue
		}
		if !plainColumns(n, sc) {
			return // a system column, a whole-row reference, a star
		}
		a.columnsIn(n, sc, func(r *relRef, col string) { member[r][col] = true })
	}
	for _, r := range sc.rels {
		pk := r.table.PrimaryKey
		if len(pk) != 1 {
			continue
		}
		key := r.table.Column(pk[0])
		if key == nil || (key.Type != "int2" && key.Type != "int4" && key.Type != "int8") {
			continue
		}
		keyAt := -1
		display := map[string]bool{}
		for i, o := range outputs {
			if o.rel != r {
				continue
			}
			if o.col == key.Name && keyAt < 0 {
				keyAt = i
			}
			if o.col != key.Name && !member[r][o.col] {
				display[o.col] = true
			}
		}
		if keyAt < 0 || len(display) == 0 {
			continue
		}
		s := &RowSplit{Output: keyAt, OutputName: outputs[keyAt].name, Outputs: outputNames, KeyColumn: key.Name, KeyType: key.Type}
		cols := make([]string, 0, len(outputs))
		for _, o := range outputs {
			if o.rel != r {
				cols = nil
				break
			}
			cols = append(cols, o.col)
		}
		if cols != nil {
			s.Fetch = fetchSQL(r.table.Name, cols, key.Name)
		}
		if s.Fetch != "" {
			s.Carry = a.carryOf(st, sc, r, s.Fetch)
			s.Repair = a.repairOf(st, sc, r, key.Name, func(rel *relRef, col string) int {
				for i, o := range outputs {
					if o.rel == rel && o.col == col {
						return i
					}
				}
				return -1
			})
		}
		reads := r.reads
		if r.all {
			// Through a star (the only whole-table read that gets here:
			// plainColumns refused the others): every column is read,
			// each either shown only or deciding membership.
			reads = map[string]bool{}
			for _, c := range r.table.Columns {
				reads[c.Name] = true
			}
		}
		for c := range reads {
			if display[c] {
				s.Display = append(s.Display, c)
			} else {
				s.Membership = append(s.Membership, c)
			}
		}
		if !slices.Contains(s.Membership, key.Name) {
			s.Membership = append(s.Membership, key.Name)
		}
		sort.Strings(s.Membership)
		sort.Strings(s.Display)
		r.split = s
	}
}

// carryOf returns the Carry of the split of r in st, whose Fetch is
// fetch, or nil: st's first ordering is a column c of r, ascending (or
// there is no LIMIT), a conjunct of its WHERE is "c >= $k" or "c > $k"
// with $k a bare parameter used nowhere else, and its offset is absent, a
// literal 0 or a parameter.
func (a *analysis) carryOf(st *pg.SelectStmt, sc *scope, r *relRef, fetch string) *Carry {
	if st.GetLimitOption() == pg.LimitOption_LIMIT_OPTION_WITH_TIES {
		return nil
	}
	var c *Carry
	var col, op string
	for _, n := range flattenAnd(st.GetWhereClause()) {
		e := n.GetAExpr()
		if e == nil || e.GetKind() != pg.A_Expr_Kind_AEXPR_OP || len(e.GetName()) != 1 {
			continue
		}
		o := e.GetName()[0].GetString_().GetSval()
		cr, p := e.GetLexpr().GetColumnRef(), e.GetRexpr().GetParamRef()
		if (o != ">=" && o != ">") || cr == nil || p == nil {
			continue
		}
		if rel, name := a.outputColumn(cr, sc); rel == r && c == nil {
			c, col, op = &Carry{Param: int(p.GetNumber())}, name, o
		}
	}
	if c == nil || c.Param <= 0 {
		return nil
	}
	if paramUses(st, c.Param) != 1 {
		return nil
	}
	if st.GetLimitCount() != nil {
		sorts := st.GetSortClause()
		if len(sorts) == 0 {
			return nil
		}
		sb := sorts[0].GetSortBy()
		cr := sb.GetNode().GetColumnRef()
		if cr == nil || len(sb.GetUseOp()) > 0 ||
			(sb.GetSortbyDir() != pg.SortByDir_SORTBY_DEFAULT && sb.GetSortbyDir() != pg.SortByDir_SORTBY_ASC) {
			return nil
		}
		if rel, name := a.outputColumn(cr, sc); rel != r || name != col {
			return nil
		}
	}
	var ok bool
	if c.Offset, ok = zeroOffset(st); !ok {
		return nil
	}
	c.Fetch = fmt.Sprintf("%s AND %s %s $2", fetch, pgx.Identifier{col}.Sanitize(), op)
	return c
}

// zeroOffset reads st's offset where the first rows must be read from:
// absent or a literal 0 (param 0), or a parameter (its number, which must
// be 0 at run time); ok false for any other.
func zeroOffset(st *pg.SelectStmt) (param int, ok bool) {
	off := st.GetLimitOffset()
	switch {
	case off == nil:
		return 0, true
	case off.GetParamRef() != nil:
		return int(off.GetParamRef().GetNumber()), true
	case off.GetAConst() != nil && off.GetAConst().GetIval() != nil && off.GetAConst().GetIval().GetIval() == 0:
		return 0, true
	}
	return 0, false
}

// repairOf returns the Repair of the split of r in st (key: r's primary
// key; outputAt: the output holding a column of a reference, or -1), or
// nil: a LIMIT must be a literal or a parameter, without WITH TIES, and
// come with one ORDER BY column of r that is an output, ascending; an
// offset must be absent, a literal 0 or a parameter.
func (a *analysis) repairOf(st *pg.SelectStmt, sc *scope, r *relRef, key string, outputAt func(*relRef, string) int) *Repair {
	if a.sql == "" || st.GetOp() != pg.SetOperation_SETOP_NONE || st.GetLimitOption() == pg.LimitOption_LIMIT_OPTION_WITH_TIES {
		return nil
	}
	rp := &Repair{SortOutput: -1}
	if lc := st.GetLimitCount(); lc != nil {
		switch {
		case lc.GetParamRef() != nil:
			rp.LimitParam = int(lc.GetParamRef().GetNumber())
			if paramUses(st, rp.LimitParam) != 1 {
				return nil // read elsewhere too: its value is not the LIMIT's alone
			}
		case lc.GetAConst() != nil && lc.GetAConst().GetIval() != nil && lc.GetAConst().GetIval().GetIval() > 0:
			rp.Limit = int(lc.GetAConst().GetIval().GetIval())
		default:
			return nil // LIMIT ALL, NULL, an expression
		}
		sorts := st.GetSortClause()
		if len(sorts) != 1 {
			return nil
		}
		sb := sorts[0].GetSortBy()
		cr := sb.GetNode().GetColumnRef()
		if cr == nil || len(sb.GetUseOp()) > 0 || sb.GetSortbyNulls() != pg.SortByNulls_SORTBY_NULLS_DEFAULT ||
			(sb.GetSortbyDir() != pg.SortByDir_SORTBY_DEFAULT && sb.GetSortbyDir() != pg.SortByDir_SORTBY_ASC) {
			return nil
		}
		rel, name := a.outputColumn(cr, sc)
		if rel != r {
			return nil
		}
		if rp.SortOutput = outputAt(rel, name); rp.SortOutput < 0 {
			return nil
		}
	}
	var ok bool
	if rp.Offset, ok = zeroOffset(st); !ok {
		return nil
	}
	rp.KeyParam = a.numParams + 1
	if rp.SQL = repairSQL(a.sql, r.alias, key, rp.KeyParam, rp.Limit > 0, fenceColumns(st, r, key)); rp.SQL == "" {
		return nil
	}
	switch {
	case rp.LimitParam > 0:
		rp.Wide, rp.WideParam = a.sql, rp.LimitParam
	case rp.Limit > 0:
		rp.WideParam = a.numParams + 1
		if rp.Wide = wideSQL(a.sql, rp.WideParam); rp.Wide == "" {
			return nil
		}
	}
	return rp
}

// paramUses counts the references to parameter n in st.
func paramUses(st *pg.SelectStmt, n int) int {
	uses := 0
	walk(st, func(m proto.Message) bool {
		if p, ok := m.(*pg.ParamRef); ok && int(p.GetNumber()) == n {
			uses++
		}
		return true
	})
	return uses
}

// repairSQL returns sql (one SELECT) with its rows of ref narrowed to
// "key = ANY($param)", and without its LIMIT when dropLimit, deparsed; ""
// when it cannot be rewritten. With fence (ref's columns the statement
// reads, in the table's order, fenceColumns), ref's table in the FROM
// clause becomes "(SELECT <fence> FROM <table> WHERE key = ANY($param)
// OFFSET 0) AS ref": the rows are found by key first, and only then
// tested against the rest of the WHERE. Given the key condition beside
// the others, PostgreSQL's planner combines the key's index with another
// (a category's, thousands of entries) into a bitmap, which costs several
// times the few rows' reads by key; the OFFSET 0 keeps the subquery whole.
// Without fence (or when ref is not a plain table in the top FROM clause)
// the condition "AND ref.key = ANY($param)" goes in the top WHERE.
func repairSQL(sql, ref, key string, param int, dropLimit bool, fence []string) string {
	return rewriteSelect(sql, func(sel *pg.SelectStmt) {
		if dropLimit {
			sel.LimitCount, sel.LimitOption = nil, pg.LimitOption_LIMIT_OPTION_DEFAULT
		}
		if len(fence) > 0 && fenceFrom(sel.GetFromClause(), ref, key, param, fence) {
			return
		}
		byKey := keyAny(param, ref, key)
		switch w := sel.GetWhereClause(); {
		case w == nil:
			sel.WhereClause = byKey
		case w.GetBoolExpr() != nil && w.GetBoolExpr().GetBoolop() == pg.BoolExprType_AND_EXPR:
			w.GetBoolExpr().Args = append(w.GetBoolExpr().Args, byKey)
		default:
			sel.WhereClause = pg.MakeBoolExprNode(pg.BoolExprType_AND_EXPR, []*pg.Node{w, byKey}, -1)
		}
	})
}

// keyAny is the condition "<column> = ANY($param)", the column named by
// its fields (a table's reference and the key, or the key alone).
func keyAny(param int, column ...string) *pg.Node {
	fields := make([]*pg.Node, len(column))
	for i, f := range column {
		fields[i] = pg.MakeStrNode(f)
	}
	return pg.MakeAExprNode(pg.A_Expr_Kind_AEXPR_OP_ANY, []*pg.Node{pg.MakeStrNode("=")},
		pg.MakeColumnRefNode(fields, -1), pg.MakeParamRefNode(int32(param), -1), -1)
}

// fenceFrom replaces the plain table referenced as ref among from (the
// FROM clause's items and the operands of its joins) with the subquery
// repairSQL describes, reporting whether it found one.
func fenceFrom(from []*pg.Node, ref, key string, param int, cols []string) bool {
	for _, n := range from {
		if j := n.GetJoinExpr(); j != nil {
			if fenceFrom([]*pg.Node{j.GetLarg(), j.GetRarg()}, ref, key, param, cols) {
				return true
			}
			continue
		}
		rv := n.GetRangeVar()
		if rv == nil {
			continue
		}
		alias := rv.GetRelname()
		if al := rv.GetAlias(); al != nil {
			if len(al.GetColnames()) > 0 {
				return false // columns renamed: the subquery would need them too
			}
			alias = al.GetAliasname()
		}
		if alias != ref {
			continue
		}
		inner := &pg.RangeVar{Catalogname: rv.GetCatalogname(), Schemaname: rv.GetSchemaname(), Relname: rv.GetRelname(),
			Inh: rv.GetInh(), Relpersistence: rv.GetRelpersistence(), Location: -1}
		targets := make([]*pg.Node, len(cols))
		for i, c := range cols {
			targets[i] = pg.MakeResTargetNodeWithVal(pg.MakeColumnRefNode([]*pg.Node{pg.MakeStrNode(c)}, -1), -1)
		}
		sub := &pg.SelectStmt{
			TargetList:  targets,
			FromClause:  []*pg.Node{{Node: &pg.Node_RangeVar{RangeVar: inner}}},
			WhereClause: keyAny(param, key),
			LimitOffset: pg.MakeAConstIntNode(0, -1),
			LimitOption: pg.LimitOption_LIMIT_OPTION_COUNT,
			Op:          pg.SetOperation_SETOP_NONE,
		}
		n.Node = &pg.Node_RangeSubselect{RangeSubselect: &pg.RangeSubselect{
			Subquery: &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: sub}},
			Alias:    &pg.Alias{Aliasname: ref},
		}}
		return true
	}
	return false
}

// fenceColumns returns the columns of r that st reads, with key, in the
// table's order (the subquery repairSQL puts in its place shows exactly
// those, so that the statement needs no privilege the query does not),
// or nil when r may not be put in a subquery: an unknown table, every
// column or the whole row read (a whole-row value would change type), or
// a column named with its schema (schema.table.column, which the
// subquery's alias does not answer to).
func fenceColumns(st *pg.SelectStmt, r *relRef, key string) []string {
	if r.table == nil || r.all {
		return nil
	}
	qualified := false
	walk(st, func(m proto.Message) bool {
		if cr, ok := m.(*pg.ColumnRef); ok && len(cr.GetFields()) > 2 {
			qualified = true
		}
		return !qualified
	})
	if qualified {
		return nil
	}
	var cols []string
	for _, c := range r.table.Columns {
		if r.reads[c.Name] || c.Name == key {
			cols = append(cols, c.Name)
		}
	}
	return cols
}

// wideSQL returns sql (one SELECT) with its LIMIT read from parameter
// param, deparsed; "" when it cannot be rewritten.
func wideSQL(sql string, param int) string {
	return rewriteSelect(sql, func(sel *pg.SelectStmt) {
		sel.LimitCount = pg.MakeParamRefNode(int32(param), -1)
	})
}

// rewriteSelect parses sql, which must be one SELECT without a set
// operation, edits it and deparses it; "" when it cannot.
func rewriteSelect(sql string, edit func(*pg.SelectStmt)) string {
	res, err := pg.Parse(sql)
	if err != nil || len(res.GetStmts()) != 1 {
		return ""
	}
	sel := res.GetStmts()[0].GetStmt().GetSelectStmt()
	if sel == nil || sel.GetOp() != pg.SetOperation_SETOP_NONE {
		return ""
	}
	edit(sel)
	out, err := pg.Deparse(res)
	if err != nil {
		return ""
	}
	return out
}

// fetchSQL is RowSplit.Fetch for table ("schema.table"), its columns
// cols and its key; "" for a name that does not split into a schema and a
// table.
func fetchSQL(table string, cols []string, key string) string {
	schema, name, ok := strings.Cut(table, ".")
	if !ok || strings.Contains(name, ".") {
		return ""
	}
	var b strings.Builder
	b.WriteString("SELECT ")
	for i, c := range cols {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(pgx.Identifier{c}.Sanitize())
	}
	fmt.Fprintf(&b, " FROM %s WHERE %s = ANY($1)", pgx.Identifier{schema, name}.Sanitize(), pgx.Identifier{key}.Sanitize())
	return b.String()
}

// plainColumns reports whether every column reference in n names a
// column the analysis knows of one of sc's tables.
func plainColumns(n *pg.Node, sc *scope) bool {
	ok := true
	walk(n, func(m proto.Message) bool {
		cr, isRef := m.(*pg.ColumnRef)
		if !isRef || !ok {
			return ok
		}
		f := fieldNames(cr)
		switch len(f) {
		case 1:
			ok = slices.ContainsFunc(sc.rels, func(r *relRef) bool { return r.table.Column(f[0]) != nil })
		case 2:
			ok = slices.ContainsFunc(sc.rels, func(r *relRef) bool { return r.alias == f[0] && r.table.Column(f[1]) != nil })
		default:
			ok = false
		}
		return false
	})
	return ok
}

// starRels returns the tables a star output (*, t.*) expands to, in
// order, or nil when cr is not a star.
func starRels(cr *pg.ColumnRef, sc *scope) []*relRef {
	f := fieldNames(cr)
	switch {
	case len(f) == 1 && f[0] == "*":
		return sc.rels
	case len(f) == 2 && f[1] == "*":
		for _, r := range sc.rels {
			if r.alias == f[0] {
				return []*relRef{r}
			}
		}
	}
	return nil
}

// outputColumn resolves an output's column reference to its one table in
// sc, or nil when it is not a plain column of exactly one.
func (a *analysis) outputColumn(cr *pg.ColumnRef, sc *scope) (*relRef, string) {
	f := fieldNames(cr)
	switch len(f) {
	case 1:
		var found *relRef
		for _, r := range sc.rels {
			if r.table.Column(f[0]) != nil {
				if found != nil {
					return nil, "" // ambiguous: PostgreSQL refuses it
				}
				found = r
			}
		}
		return found, f[0]
	case 2:
		if f[1] == "*" {
			return nil, ""
		}
		for _, r := range sc.rels {
			if r.alias == f[0] && r.table.Column(f[1]) != nil {
				return r, f[1]
			}
		}
	}
	return nil, ""
}
