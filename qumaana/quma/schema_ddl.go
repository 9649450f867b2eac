package quma

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"

	pg "github.com/pganalyze/pg_query_go/v6"
	"github.com/pganalyze/pg_query_go/v6/parser"
)

// LoadDDL builds a Schema from a file of DDL statements, as psql would run
// them against an empty database: tables, their keys and replica identity,
// views, and function volatility. Statements that do not shape what the
// analyzer needs (SET, COMMENT, GRANT, CREATE EXTENSION, INSERT, ...) are
// skipped. A syntax error is a *SyntaxError with its line and column; a
// statement PostgreSQL would reject for a reason that matters here (a key on
// a missing column, a second primary key, an unknown table) is an error that
// names its line and column too, since guessing would yield a schema that
// disagrees with the real database.
//
// Unqualified names go to schema "public", and so do temporary tables: the
// analyzer resolves names through Schema.SearchPath, and PostgreSQL resolves
// an unqualified name to a temporary table before any schema on the path.
func LoadDDL(sql string) (*Schema, error) {
	tree, err := pg.Parse(sql)
	if err != nil {
		return nil, ddlSyntaxError(sql, err)
	}
	ld := &ddlLoader{
		sql:        sql,
		version:    tree.GetVersion(),
		schema:     ddlDefaultSchema,
		tables:     map[string]*ddlTable{},
		views:      map[string]*View{},
		indexes:    map[string]*ddlIndex{},
		domains:    map[string]string{},
		composites: map[string][]Column{},
		funcs:      map[string]map[string]Volatility{},
	}
	for _, raw := range tree.GetStmts() {
		ld.stmtStart = int(raw.GetStmtLocation())
		if err := ld.statement(raw.GetStmt()); err != nil {
			return nil, err
		}
	}
	s := ld.finish()
	if err := s.Validate(); err != nil {
		return nil, err
	}
	return s, nil
}

// ddlDefaultSchema is where unqualified names go: the first schema of
// PostgreSQL's default search_path that exists in a fresh database.
const ddlDefaultSchema = "public"

// ddlNameDataLen is PostgreSQL's NAMEDATALEN: identifiers are cut to one
// byte less. Generated index names follow the same rule, so that REPLICA
// IDENTITY USING INDEX can name an index a constraint created implicitly.
const ddlNameDataLen = 64

// ddlLikeIndexes is CREATE_TABLE_LIKE_INDEXES in TableLikeClause.options,
// which holds the C bit flags, not pg_query's protobuf enum numbering.
const ddlLikeIndexes = 1 << 6

type ddlLoader struct {
	sql       string
	version   int32  // of the parse tree, which Deparse checks
	stmtStart int    // byte offset of the statement being loaded
	schema    string // for unqualified names; CREATE SCHEMA ... CREATE TABLE changes it

	tables    map[string]*ddlTable // by qualified name
	tableList []*ddlTable          // creation order: parents precede partitions
	views     map[string]*View
	indexes   map[string]*ddlIndex // by qualified name; indexes live in their table's schema
	indexList []*ddlIndex          // creation order: the catalog's order of unique keys

	domains    map[string]string   // qualified domain name → canonical base type
	composites map[string][]Column // for CREATE TABLE ... OF type
	funcs      map[string]map[string]Volatility
}

type ddlTable struct {
	t       *Table
	schema  string
	relname string
	// identity is the REPLICA IDENTITY mode; identityIndex its index for "index".
	identity      string
	identityIndex *ddlIndex
	partitionOf   *ddlTable   // partitions get the keys of their partitioned parent
	parents       []*ddlTable // INHERITS and PARTITION OF: column changes recurse to children
	dropped       bool
}

type ddlIndex struct {
	schema, name string
	table        *ddlTable
	cols         []string // key columns; nil when any is an expression
	unique       bool
	primary      bool
	constraint   bool // backs a PRIMARY KEY or UNIQUE constraint
	partial      bool
	dropped      bool
}

// ddlKey is a PRIMARY KEY or UNIQUE constraint waiting for its index.
type ddlKey struct {
	name    string // constraint name; "" to generate one
	cols    []string
	primary bool
	index   string // ADD ... USING INDEX
	loc     int32
}

func (ld *ddlLoader) statement(n *pg.Node) error {
	switch st := n.GetNode().(type) {
	case *pg.Node_CreateStmt:
		return ld.createTable(st.CreateStmt)
	case *pg.Node_IndexStmt:
		return ld.createIndex(st.IndexStmt)
	case *pg.Node_AlterTableStmt:
		return ld.alterTable(st.AlterTableStmt)
	case *pg.Node_ViewStmt:
		v := st.ViewStmt
		return ld.createView(v.GetView(), v.GetQuery(), ddlStrings(v.GetAliases()), v.GetReplace(), false)
	case *pg.Node_CreateTableAsStmt:
		// CREATE TABLE AS gives columns whose types only analysis could tell:
		// skipped, like the other statements this loader does not model.
		if st.CreateTableAsStmt.GetObjtype() == pg.ObjectType_OBJECT_MATVIEW {
			into := st.CreateTableAsStmt.GetInto()
			return ld.createView(into.GetRel(), st.CreateTableAsStmt.GetQuery(), ddlStrings(into.GetColNames()), false, st.CreateTableAsStmt.GetIfNotExists())
		}
	case *pg.Node_CreateFunctionStmt:
		ld.createFunction(st.CreateFunctionStmt)
	case *pg.Node_AlterFunctionStmt:
		ld.alterFunction(st.AlterFunctionStmt)
	case *pg.Node_CreateDomainStmt:
		ld.domains[ld.qualifyNames(ddlStrings(st.CreateDomainStmt.GetDomainname()))] = ld.typeName(st.CreateDomainStmt.GetTypeName())
	case *pg.Node_CompositeTypeStmt:
		var cols []Column
		for _, e := range st.CompositeTypeStmt.GetColdeflist() {
			if cd := e.GetColumnDef(); cd != nil {
				cols = append(cols, Column{Name: cd.GetColname(), Type: ld.typeName(cd.GetTypeName())})
			}
		}
		ld.composites[ld.qualify(st.CompositeTypeStmt.GetTypevar())] = cols
	case *pg.Node_DropStmt:
		ld.drop(st.DropStmt)
	case *pg.Node_RenameStmt:
		return ld.rename(st.RenameStmt)
	case *pg.Node_CreateSchemaStmt:
		name := st.CreateSchemaStmt.GetSchemaname()
		if name == "" {
			name = st.CreateSchemaStmt.GetAuthrole().GetRolename()
		}
		saved := ld.schema
		ld.schema = name
		defer func() { ld.schema = saved }()
		for _, e := range st.CreateSchemaStmt.GetSchemaElts() {
			if err := ld.statement(e); err != nil {
				return err
			}
		}
	}
	return nil
}

// createTable loads CREATE TABLE, including INHERITS, PARTITION OF, OF type
// and LIKE.
func (ld *ddlLoader) createTable(st *pg.CreateStmt) error {
	rv := st.GetRelation()
	schema, temp, err := ld.createSchema(rv)
	if err != nil {
		return err
	}
	name := schema + "." + rv.GetRelname()
	if ld.relExists(name) {
		if st.GetIfNotExists() {
			return nil
		}
		return ld.errorf(rv.GetLocation(), "relation %s already exists", name)
	}
	tbl := &ddlTable{t: &Table{Name: name, Temporary: temp}, schema: schema, relname: rv.GetRelname(), identity: "default"}
	inherited := map[string]bool{}
	if of := st.GetOfTypename(); of != nil {
		typ := ld.qualifyNames(ddlStrings(of.GetNames()))
		cols, ok := ld.composites[typ]
		if !ok {
			return ld.errorf(of.GetLocation(), "type %s is not a composite type created in this file", typ)
		}
		for _, c := range cols {
			tbl.t.Columns = append(tbl.t.Columns, c)
			inherited[c.Name] = true
		}
	}
	for _, n := range st.GetInhRelations() {
		prv := n.GetRangeVar()
		parent := ld.table(prv)
		if parent == nil {
			return ld.errorf(prv.GetLocation(), "relation %s does not exist", ld.qualify(prv))
		}
		for _, c := range parent.t.Columns {
			ddlMergeColumn(tbl.t, c)
			inherited[c.Name] = true
		}
		tbl.parents = append(tbl.parents, parent)
		if st.GetPartbound() != nil {
			tbl.partitionOf = parent
		}
	}
	var keys []ddlKey
	var likes []*ddlTable
	for _, e := range st.GetTableElts() {
		switch e := e.GetNode().(type) {
		case *pg.Node_ColumnDef:
			cd := e.ColumnDef
			if tbl.t.Column(cd.GetColname()) != nil && !inherited[cd.GetColname()] {
				return ld.errorf(cd.GetLocation(), "column %q specified more than once", cd.GetColname())
			}
			if err := ld.columnDef(tbl, cd, &keys); err != nil {
				return err
			}
		case *pg.Node_Constraint:
			if k, ok := ddlTableKey(e.Constraint); ok {
				keys = append(keys, k)
			}
		case *pg.Node_TableLikeClause:
			lrv := e.TableLikeClause.GetRelation()
			src := ld.table(lrv)
			if src == nil {
				return ld.errorf(lrv.GetLocation(), "relation %s does not exist", ld.qualify(lrv))
			}
			for _, c := range src.t.Columns {
				ddlMergeColumn(tbl.t, c)
			}
			if e.TableLikeClause.GetOptions()&ddlLikeIndexes != 0 {
				likes = append(likes, src)
			}
		}
	}
	ld.tables[name] = tbl
	ld.tableList = append(ld.tableList, tbl)

	for _, k := range ddlMergeKeys(keys) {
		if err := ld.addKey(tbl, k); err != nil {
			return err
		}
	}
	// LIKE ... INCLUDING INDEXES copies the indexes after the table exists,
	// that is after its own constraints' indexes.
	for _, src := range likes {
		for _, ix := range ld.liveIndexes(src) {
			if ix.primary && ld.primary(tbl) != nil {
				return ld.errorf(rv.GetLocation(), "multiple primary keys for table %s are not allowed", name)
			}
			ld.addIndex(tbl, "", ix.cols, ix.cols, ix.unique, ix.primary, ix.constraint, ix.partial)
			if ix.primary {
				ddlSetNotNull(tbl.t, ix.cols)
			}
		}
	}
	return nil
}

// createSchema returns the schema a new relation goes to and whether it is
// temporary.
func (ld *ddlLoader) createSchema(rv *pg.RangeVar) (schema string, temp bool, err error) {
	temp = rv.GetRelpersistence() == "t" || rv.GetSchemaname() == "pg_temp"
	if temp && rv.GetSchemaname() != "" && rv.GetSchemaname() != "pg_temp" {
		return "", false, ld.errorf(rv.GetLocation(), "cannot create temporary relation in non-temporary schema %s", rv.GetSchemaname())
	}
	if temp {
		return ddlDefaultSchema, true, nil
	}
	if rv.GetSchemaname() != "" {
		return rv.GetSchemaname(), false, nil
	}
	return ld.schema, false, nil
}

// columnDef adds (or, for an inherited column, amends) a column and queues
// its PRIMARY KEY and UNIQUE constraints on keys.
func (ld *ddlLoader) columnDef(tbl *ddlTable, cd *pg.ColumnDef, keys *[]ddlKey) error {
	name := cd.GetColname()
	col := tbl.t.Column(name)
	if tn := cd.GetTypeName(); tn != nil {
		typ := ld.typeName(tn)
		if col == nil {
			tbl.t.Columns = append(tbl.t.Columns, Column{Name: name})
			col = &tbl.t.Columns[len(tbl.t.Columns)-1]
		}
		col.Type = typ
		if ddlSerial(tn) {
			col.NotNull = true
		}
	} else if col == nil {
		return ld.errorf(cd.GetLocation(), "column %q does not exist", name)
	}
	if cd.GetIsNotNull() {
		col.NotNull = true
	}
	for _, n := range cd.GetConstraints() {
		c := n.GetConstraint()
		switch c.GetContype() {
		case pg.ConstrType_CONSTR_NOTNULL, pg.ConstrType_CONSTR_IDENTITY:
			col.NotNull = true
		case pg.ConstrType_CONSTR_PRIMARY, pg.ConstrType_CONSTR_UNIQUE:
			*keys = append(*keys, ddlKey{
				name:    c.GetConname(),
				cols:    []string{name},
				primary: c.GetContype() == pg.ConstrType_CONSTR_PRIMARY,
				index:   c.GetIndexname(),
				loc:     c.GetLocation(),
			})
		}
	}
	return nil
}

// ddlMergeKeys orders the key constraints of one statement as PostgreSQL
// builds their indexes: the primary key first, and constraints on the same
// column list merged into one index (which changes the names generated for
// later ones).
func ddlMergeKeys(keys []ddlKey) []ddlKey {
	sort.SliceStable(keys, func(i, j int) bool { return keys[i].primary && !keys[j].primary })
	var merged []ddlKey
next:
	for _, k := range keys {
		for i := range merged {
			if k.index == "" && merged[i].index == "" && slices.Equal(merged[i].cols, k.cols) {
				if merged[i].name == "" {
					merged[i].name = k.name
				}
				continue next
			}
		}
		merged = append(merged, k)
	}
	return merged
}

// ddlTableKey returns a table constraint's key, if it is one.
func ddlTableKey(c *pg.Constraint) (ddlKey, bool) {
	switch c.GetContype() {
	case pg.ConstrType_CONSTR_PRIMARY, pg.ConstrType_CONSTR_UNIQUE:
		return ddlKey{
			name:    c.GetConname(),
			cols:    ddlStrings(c.GetKeys()),
			primary: c.GetContype() == pg.ConstrType_CONSTR_PRIMARY,
			index:   c.GetIndexname(),
			loc:     c.GetLocation(),
		}, true
	}
	return ddlKey{}, false
}

// addKey creates the index of a PRIMARY KEY or UNIQUE constraint, or adopts
// the existing index of ADD ... USING INDEX.
func (ld *ddlLoader) addKey(tbl *ddlTable, k ddlKey) error {
	if k.primary && ld.primary(tbl) != nil {
		return ld.errorf(k.loc, "multiple primary keys for table %s are not allowed", tbl.t.Name)
	}
	if k.index != "" {
		ix := ld.indexes[tbl.schema+"."+k.index]
		if ix == nil || ix.dropped || ix.table != tbl {
			return ld.errorf(k.loc, "index %q of table %s does not exist", k.index, tbl.t.Name)
		}
		if !ix.unique || ix.cols == nil || ix.partial {
			return ld.errorf(k.loc, "index %q is not a unique index on plain columns without a predicate", k.index)
		}
		ix.constraint = true
		ix.primary = k.primary
		if k.name != "" && k.name != ix.name {
			// The constraint takes the index over under its own name.
			if err := ld.renameIndex(ix, k.name, k.loc); err != nil {
				return err
			}
		}
		if k.primary {
			ddlSetNotNull(tbl.t, ix.cols)
		}
		return nil
	}
	if len(k.cols) == 0 {
		return ld.errorf(k.loc, "table %s: key without columns", tbl.t.Name)
	}
	for _, c := range k.cols {
		if tbl.t.Column(c) == nil {
			return ld.errorf(k.loc, "table %s: key column %q does not exist", tbl.t.Name, c)
		}
	}
	if k.name != "" && ld.relExists(tbl.schema+"."+k.name) {
		return ld.errorf(k.loc, "relation %s.%s already exists", tbl.schema, k.name)
	}
	ld.addIndex(tbl, k.name, k.cols, k.cols, true, k.primary, true, false)
	if k.primary {
		ddlSetNotNull(tbl.t, k.cols)
	}
	return nil
}

// addIndex registers an index; colnames (every column's name, expressions
// included) choose its name when name is "".
func (ld *ddlLoader) addIndex(tbl *ddlTable, name string, cols, colnames []string, unique, primary, constraint, partial bool) *ddlIndex {
	if name == "" {
		name = ld.chooseIndexName(tbl, colnames, primary, constraint)
	}
	ix := &ddlIndex{
		schema: tbl.schema, name: name, table: tbl,
		cols:   append([]string(nil), cols...),
		unique: unique, primary: primary, constraint: constraint, partial: partial,
	}
	if cols == nil {
		ix.cols = nil
	}
	ld.indexes[tbl.schema+"."+name] = ix
	ld.indexList = append(ld.indexList, ix)
	return ix
}

// primary returns the table's primary key index, or nil.
func (ld *ddlLoader) primary(tbl *ddlTable) *ddlIndex {
	for _, ix := range ld.liveIndexes(tbl) {
		if ix.primary {
			return ix
		}
	}
	return nil
}

func (ld *ddlLoader) liveIndexes(tbl *ddlTable) []*ddlIndex {
	var out []*ddlIndex
	for _, ix := range ld.indexList {
		if !ix.dropped && ix.table == tbl {
			out = append(out, ix)
		}
	}
	return out
}

func (ld *ddlLoader) createIndex(st *pg.IndexStmt) error {
	rv := st.GetRelation()
	tbl := ld.table(rv)
	if tbl == nil {
		if ld.views[ld.qualify(rv)] != nil {
			return nil // a materialized view's index: views have no keys here
		}
		return ld.errorf(rv.GetLocation(), "relation %s does not exist", ld.qualify(rv))
	}
	var cols, colnames []string
	plain := true
	for _, p := range st.GetIndexParams() {
		el := p.GetIndexElem()
		if el.GetName() != "" {
			if tbl.t.Column(el.GetName()) == nil {
				return ld.errorf(rv.GetLocation(), "column %q does not exist in %s", el.GetName(), tbl.t.Name)
			}
			cols = append(cols, el.GetName())
			colnames = append(colnames, el.GetName())
			continue
		}
		plain = false
		colnames = append(colnames, ddlExprColname(el))
	}
	for _, p := range st.GetIndexIncludingParams() {
		colnames = append(colnames, p.GetIndexElem().GetName())
	}
	if !plain {
		cols = nil
	}
	name := st.GetIdxname()
	if name != "" && ld.relExists(tbl.schema+"."+name) {
		if st.GetIfNotExists() {
			return nil
		}
		return ld.errorf(rv.GetLocation(), "relation %s.%s already exists", tbl.schema, name)
	}
	ld.addIndex(tbl, name, cols, ddlUniqueColnames(colnames), st.GetUnique(), st.GetPrimary(), st.GetIsconstraint(), st.GetWhereClause() != nil)
	return nil
}

func (ld *ddlLoader) alterTable(st *pg.AlterTableStmt) error {
	if st.GetObjtype() != pg.ObjectType_OBJECT_TABLE {
		return nil
	}
	rv := st.GetRelation()
	var tbl *ddlTable
	// PostgreSQL runs the subcommands in passes: columns first, then the
	// key constraints (the primary key first, as in CREATE TABLE), then
	// REPLICA IDENTITY, which may name an index added by the same statement.
	var keys []ddlKey
	var identities []*pg.ReplicaIdentityStmt
	for _, n := range st.GetCmds() {
		cmd := n.GetAlterTableCmd()
		switch cmd.GetSubtype() {
		case pg.AlterTableType_AT_AddColumn, pg.AlterTableType_AT_DropColumn,
			pg.AlterTableType_AT_SetNotNull, pg.AlterTableType_AT_DropNotNull,
			pg.AlterTableType_AT_AlterColumnType, pg.AlterTableType_AT_AddConstraint,
			pg.AlterTableType_AT_DropConstraint, pg.AlterTableType_AT_ReplicaIdentity:
		default:
			continue // OWNER TO, SET DEFAULT, ... on whatever relation: nothing to model
		}
		if tbl == nil {
			if tbl = ld.table(rv); tbl == nil {
				if st.GetMissingOk() {
					return nil
				}
				return ld.errorf(rv.GetLocation(), "relation %s does not exist", ld.qualify(rv))
			}
		}
		// Column changes recurse to inheritance children and partitions
		// unless ONLY is given.
		family := []*ddlTable{tbl}
		if rv.GetInh() {
			family = ld.descendants(tbl)
		}
		switch cmd.GetSubtype() {
		case pg.AlterTableType_AT_AddColumn:
			cd := cmd.GetDef().GetColumnDef()
			if tbl.t.Column(cd.GetColname()) != nil {
				if cmd.GetMissingOk() {
					continue
				}
				return ld.errorf(cd.GetLocation(), "column %q of relation %s already exists", cd.GetColname(), tbl.t.Name)
			}
			if err := ld.columnDef(tbl, cd, &keys); err != nil {
				return err
			}
			added := *tbl.t.Column(cd.GetColname())
			for _, child := range family[1:] {
				ddlMergeColumn(child.t, Column{Name: added.Name, Type: added.Type, NotNull: added.NotNull})
			}
		case pg.AlterTableType_AT_DropColumn:
			if tbl.t.Column(cmd.GetName()) == nil {
				if cmd.GetMissingOk() {
					continue
				}
				return ld.errorf(rv.GetLocation(), "column %q of relation %s does not exist", cmd.GetName(), tbl.t.Name)
			}
			for _, t := range family {
				ld.dropColumn(t, cmd.GetName())
			}
		case pg.AlterTableType_AT_SetNotNull, pg.AlterTableType_AT_DropNotNull, pg.AlterTableType_AT_AlterColumnType:
			if tbl.t.Column(cmd.GetName()) == nil {
				return ld.errorf(rv.GetLocation(), "column %q of relation %s does not exist", cmd.GetName(), tbl.t.Name)
			}
			for _, t := range family {
				col := t.t.Column(cmd.GetName())
				if col == nil {
					continue
				}
				switch cmd.GetSubtype() {
				case pg.AlterTableType_AT_SetNotNull:
					col.NotNull = true
				case pg.AlterTableType_AT_DropNotNull:
					col.NotNull = false
				default:
					if tn := cmd.GetDef().GetColumnDef().GetTypeName(); tn != nil {
						col.Type = ld.typeName(tn)
					}
				}
			}
		case pg.AlterTableType_AT_AddConstraint:
			if k, ok := ddlTableKey(cmd.GetDef().GetConstraint()); ok {
				keys = append(keys, k)
			}
		case pg.AlterTableType_AT_DropConstraint:
			// Only key constraints are modelled; dropping a CHECK or FOREIGN
			// KEY constraint changes nothing here.
			if ix := ld.indexes[tbl.schema+"."+cmd.GetName()]; ix != nil && !ix.dropped && ix.table == tbl && ix.constraint {
				ix.dropped = true
			}
		case pg.AlterTableType_AT_ReplicaIdentity:
			identities = append(identities, cmd.GetDef().GetReplicaIdentityStmt())
		}
	}
	if tbl == nil {
		return nil
	}
	for _, k := range ddlMergeKeys(keys) {
		if err := ld.addKey(tbl, k); err != nil {
			return err
		}
	}
	for _, ri := range identities {
		if err := ld.replicaIdentity(tbl, ri, rv.GetLocation()); err != nil {
			return err
		}
	}
	return nil
}

func (ld *ddlLoader) replicaIdentity(tbl *ddlTable, ri *pg.ReplicaIdentityStmt, loc int32) error {
	switch ri.GetIdentityType() {
	case "d":
		tbl.identity, tbl.identityIndex = "default", nil
	case "f":
		tbl.identity, tbl.identityIndex = "full", nil
	case "n":
		tbl.identity, tbl.identityIndex = "nothing", nil
	case "i":
		ix := ld.indexes[tbl.schema+"."+ri.GetName()]
		if ix == nil || ix.dropped || ix.table != tbl {
			return ld.errorf(loc, "replica identity: index %q of table %s is not created in this file", ri.GetName(), tbl.t.Name)
		}
		if !ix.unique || ix.cols == nil || ix.partial {
			return ld.errorf(loc, "replica identity: index %q is not a unique index on plain columns without a predicate", ri.GetName())
		}
		tbl.identity, tbl.identityIndex = "index", ix
	default:
		return ld.errorf(loc, "replica identity %q", ri.GetIdentityType())
	}
	return nil
}

// dropColumn removes a column and, as PostgreSQL does, every index on it.
func (ld *ddlLoader) dropColumn(tbl *ddlTable, name string) {
	cols := tbl.t.Columns[:0]
	for _, c := range tbl.t.Columns {
		if c.Name != name {
			cols = append(cols, c)
		}
	}
	tbl.t.Columns = cols
	for _, ix := range ld.liveIndexes(tbl) {
		for _, c := range ix.cols {
			if c == name {
				ix.dropped = true
			}
		}
	}
}

// descendants returns tbl and the tables that inherit from it, parents first.
func (ld *ddlLoader) descendants(tbl *ddlTable) []*ddlTable {
	out := []*ddlTable{tbl}
	in := map[*ddlTable]bool{tbl: true}
	for _, t := range ld.tableList {
		if t.dropped || in[t] {
			continue
		}
		for _, p := range t.parents {
			if in[p] {
				out = append(out, t)
				in[t] = true
				break
			}
		}
	}
	return out
}

func (ld *ddlLoader) createView(rv *pg.RangeVar, query *pg.Node, aliases []string, replace, ifNotExists bool) error {
	schema, _, err := ld.createSchema(rv)
	if err != nil {
		return err
	}
	name := schema + "." + rv.GetRelname()
	if ld.relExists(name) {
		switch {
		case ifNotExists:
			return nil
		case !replace || ld.views[name] == nil:
			return ld.errorf(rv.GetLocation(), "relation %s already exists", name)
		}
	}
	if query == nil {
		return ld.errorf(rv.GetLocation(), "view %s has no query", name)
	}
	text, err := ddlViewQuery(ld.version, rv.GetRelname(), query, aliases)
	if err != nil {
		return ld.errorf(rv.GetLocation(), "view %s: %v", name, err)
	}
	ld.views[name] = &View{Name: name, Query: text}
	return nil
}

// ddlViewQuery returns the SQL text of a view's query. A column list given
// to the view renames its output columns: in place when the query is a plain
// SELECT whose output names no clause refers to, as pg_get_viewdef shows it,
// otherwise by wrapping it as SELECT * FROM (query) AS name(aliases).
func ddlViewQuery(version int32, relname string, query *pg.Node, aliases []string) (string, error) {
	if len(aliases) > 0 && !ddlRenameTargets(query.GetSelectStmt(), aliases) {
		colnames := make([]*pg.Node, len(aliases))
		for i, a := range aliases {
			colnames[i] = pg.MakeStrNode(a)
		}
		query = &pg.Node{Node: &pg.Node_SelectStmt{SelectStmt: &pg.SelectStmt{
			TargetList: []*pg.Node{pg.MakeResTargetNodeWithVal(pg.MakeColumnRefNode([]*pg.Node{pg.MakeAStarNode()}, -1), -1)},
			FromClause: []*pg.Node{{Node: &pg.Node_RangeSubselect{RangeSubselect: &pg.RangeSubselect{
				Subquery: query,
				Alias:    &pg.Alias{Aliasname: relname, Colnames: colnames},
			}}}},
			LimitOption: pg.LimitOption_LIMIT_OPTION_DEFAULT,
			Op:          pg.SetOperation_SETOP_NONE,
		}}}
	}
	return pg.Deparse(&pg.ParseResult{Version: version, Stmts: []*pg.RawStmt{{Stmt: query}}})
}

// ddlRenameTargets names the first output columns of sel, when that is safe.
func ddlRenameTargets(sel *pg.SelectStmt, names []string) bool {
	if sel == nil || sel.GetOp() != pg.SetOperation_SETOP_NONE || len(sel.GetValuesLists()) > 0 ||
		len(sel.GetSortClause()) > 0 || len(sel.GetGroupClause()) > 0 || len(sel.GetDistinctClause()) > 0 ||
		len(names) > len(sel.GetTargetList()) {
		return false
	}
	for i := range names {
		rt := sel.GetTargetList()[i].GetResTarget()
		if rt == nil {
			return false
		}
		if fields := rt.GetVal().GetColumnRef().GetFields(); len(fields) > 0 && fields[len(fields)-1].GetAStar() != nil {
			return false // a * expands to an unknown number of columns
		}
	}
	for i, name := range names {
		sel.GetTargetList()[i].GetResTarget().Name = name
	}
	return true
}

func (ld *ddlLoader) createFunction(st *pg.CreateFunctionStmt) {
	if st.GetIsProcedure() {
		return // procedures cannot appear in queries
	}
	vol := Volatile
	for _, o := range st.GetOptions() {
		if v, ok := ddlVolatility(o.GetDefElem()); ok {
			vol = v
		}
	}
	var args []*pg.TypeName
	for _, p := range st.GetParameters() {
		fp := p.GetFunctionParameter()
		switch fp.GetMode() {
		case pg.FunctionParameterMode_FUNC_PARAM_OUT, pg.FunctionParameterMode_FUNC_PARAM_TABLE:
			continue // not part of the signature
		}
		args = append(args, fp.GetArgType())
	}
	name := ld.qualifyNames(ddlStrings(st.GetFuncname()))
	if ld.funcs[name] == nil {
		ld.funcs[name] = map[string]Volatility{}
	}
	ld.funcs[name][ld.signature(args)] = vol
}

func (ld *ddlLoader) alterFunction(st *pg.AlterFunctionStmt) {
	if st.GetObjtype() != pg.ObjectType_OBJECT_FUNCTION {
		return
	}
	vol, ok := Volatility(""), false
	for _, a := range st.GetActions() {
		if v, isVol := ddlVolatility(a.GetDefElem()); isVol {
			vol, ok = v, true
		}
	}
	if !ok {
		return
	}
	name := ld.qualifyNames(ddlStrings(st.GetFunc().GetObjname()))
	sigs := ld.funcs[name]
	if sigs == nil {
		// Altering a function this file did not create (an extension's, say)
		// still says what the database will hold.
		sigs = map[string]Volatility{}
		ld.funcs[name] = sigs
	}
	if st.GetFunc().GetArgsUnspecified() {
		if len(sigs) == 0 {
			sigs[""] = vol
		}
		for sig := range sigs {
			sigs[sig] = vol
		}
		return
	}
	sigs[ld.signature(ddlTypeNames(st.GetFunc().GetObjargs()))] = vol
}

func ddlVolatility(d *pg.DefElem) (Volatility, bool) {
	if d.GetDefname() != "volatility" {
		return "", false
	}
	switch d.GetArg().GetString_().GetSval() {
	case "immutable":
		return Immutable, true
	case "stable":
		return Stable, true
	}
	return Volatile, true
}

// signature identifies one overload of a function by its input types.
func (ld *ddlLoader) signature(args []*pg.TypeName) string {
	parts := make([]string, len(args))
	for i, a := range args {
		parts[i] = ld.typeName(a)
	}
	return strings.Join(parts, ",")
}

func (ld *ddlLoader) drop(st *pg.DropStmt) {
	for _, obj := range st.GetObjects() {
		switch st.GetRemoveType() {
		case pg.ObjectType_OBJECT_TABLE:
			if tbl := ld.tables[ld.qualifyNames(ddlStrings(obj.GetList().GetItems()))]; tbl != nil {
				ld.dropTable(tbl)
			}
		case pg.ObjectType_OBJECT_VIEW, pg.ObjectType_OBJECT_MATVIEW:
			delete(ld.views, ld.qualifyNames(ddlStrings(obj.GetList().GetItems())))
		case pg.ObjectType_OBJECT_INDEX:
			if ix := ld.indexes[ld.qualifyNames(ddlStrings(obj.GetList().GetItems()))]; ix != nil {
				ix.dropped = true
			}
		case pg.ObjectType_OBJECT_FUNCTION:
			owa := obj.GetObjectWithArgs()
			name := ld.qualifyNames(ddlStrings(owa.GetObjname()))
			if owa.GetArgsUnspecified() {
				delete(ld.funcs, name)
			} else if sigs := ld.funcs[name]; sigs != nil {
				delete(sigs, ld.signature(ddlTypeNames(owa.GetObjargs())))
				if len(sigs) == 0 {
					delete(ld.funcs, name)
				}
			}
		case pg.ObjectType_OBJECT_DOMAIN:
			delete(ld.domains, ld.qualifyNames(ddlStrings(obj.GetTypeName().GetNames())))
		}
	}
}

// dropTable drops a table with its indexes and, as DROP ... CASCADE does and
// PostgreSQL always does for partitions, the tables inheriting from it.
func (ld *ddlLoader) dropTable(tbl *ddlTable) {
	for _, t := range ld.descendants(tbl) {
		t.dropped = true
		delete(ld.tables, t.t.Name)
		for _, ix := range ld.liveIndexes(t) {
			ix.dropped = true
		}
	}
}

func (ld *ddlLoader) rename(st *pg.RenameStmt) error {
	rv := st.GetRelation()
	switch st.GetRenameType() {
	case pg.ObjectType_OBJECT_TABLE, pg.ObjectType_OBJECT_VIEW, pg.ObjectType_OBJECT_MATVIEW, pg.ObjectType_OBJECT_INDEX:
		// ALTER TABLE ... RENAME TO works on any relation kind.
		old := ld.qualify(rv)
		schema := old[:strings.LastIndexByte(old, '.')]
		name := schema + "." + st.GetNewname()
		if !ld.relExists(old) {
			if st.GetMissingOk() {
				return nil
			}
			return ld.errorf(rv.GetLocation(), "relation %s does not exist", old)
		}
		if ld.relExists(name) {
			return ld.errorf(rv.GetLocation(), "relation %s already exists", name)
		}
		switch {
		case ld.tables[old] != nil:
			tbl := ld.tables[old]
			delete(ld.tables, old)
			tbl.t.Name, tbl.relname = name, st.GetNewname()
			ld.tables[name] = tbl
		case ld.views[old] != nil:
			v := ld.views[old]
			delete(ld.views, old)
			v.Name = name
			ld.views[name] = v
		default:
			return ld.renameIndex(ld.indexes[old], st.GetNewname(), rv.GetLocation())
		}
	case pg.ObjectType_OBJECT_COLUMN:
		if st.GetRelationType() != pg.ObjectType_OBJECT_TABLE {
			return nil
		}
		tbl := ld.table(rv)
		if tbl == nil {
			if st.GetMissingOk() || ld.views[ld.qualify(rv)] != nil {
				return nil
			}
			return ld.errorf(rv.GetLocation(), "relation %s does not exist", ld.qualify(rv))
		}
		if tbl.t.Column(st.GetSubname()) == nil {
			return ld.errorf(rv.GetLocation(), "column %q of relation %s does not exist", st.GetSubname(), tbl.t.Name)
		}
		if tbl.t.Column(st.GetNewname()) != nil {
			return ld.errorf(rv.GetLocation(), "column %q of relation %s already exists", st.GetNewname(), tbl.t.Name)
		}
		for _, t := range ld.descendants(tbl) {
			if col := t.t.Column(st.GetSubname()); col != nil {
				col.Name = st.GetNewname()
			}
			for _, ix := range ld.liveIndexes(t) {
				for i, c := range ix.cols {
					if c == st.GetSubname() {
						ix.cols[i] = st.GetNewname()
					}
				}
			}
		}
	case pg.ObjectType_OBJECT_TABCONSTRAINT:
		tbl := ld.table(rv)
		if tbl == nil {
			return nil
		}
		if ix := ld.indexes[tbl.schema+"."+st.GetSubname()]; ix != nil && !ix.dropped && ix.table == tbl && ix.constraint {
			return ld.renameIndex(ix, st.GetNewname(), rv.GetLocation())
		}
	}
	return nil
}

func (ld *ddlLoader) renameIndex(ix *ddlIndex, name string, loc int32) error {
	if ix == nil || ix.dropped {
		return nil
	}
	if ld.relExists(ix.schema + "." + name) {
		return ld.errorf(loc, "relation %s.%s already exists", ix.schema, name)
	}
	delete(ld.indexes, ix.schema+"."+ix.name)
	ix.name = name
	ld.indexes[ix.schema+"."+name] = ix
	return nil
}

// finish builds the Schema: keys, identity columns and function volatility
// are settled only now because later statements may add or drop keys that a
// partition or a replica identity depends on.
func (ld *ddlLoader) finish() *Schema {
	s := NewSchema()
	for _, tbl := range ld.tableList {
		if tbl.dropped {
			continue
		}
		t := tbl.t
		var pk []string
		var uniques [][]string
		if p := tbl.partitionOf; p != nil && !p.dropped {
			pk = p.t.PrimaryKey
			uniques = append(uniques, p.t.UniqueKeys...)
		}
		for _, ix := range ld.liveIndexes(tbl) {
			if !ix.unique || ix.cols == nil || ix.partial {
				continue
			}
			if ix.primary {
				pk = ix.cols
			} else {
				uniques = append(uniques, ix.cols)
			}
		}
		t.PrimaryKey = ddlClone(pk)
		ddlSetNotNull(t, pk)
		t.UniqueKeys = ddlDedupKeys(t.PrimaryKey, uniques)
		t.ReplicaIdentity = tbl.identity
		switch tbl.identity {
		case "default":
			t.IdentityColumns = ddlClone(t.PrimaryKey)
		case "full":
			t.IdentityColumns = t.ColumnNames()
		case "index":
			if ix := tbl.identityIndex; ix != nil && !ix.dropped {
				t.IdentityColumns = ddlClone(ix.cols)
			}
		}
		s.Tables[t.Name] = t
	}
	for name, v := range ld.views {
		s.Views[name] = v
	}
	for name, sigs := range ld.funcs {
		if len(sigs) > 0 {
			s.Functions[name] = ddlMostVolatile(sigs)
		}
	}
	return s
}

// ddlMostVolatile folds a function's overloads into one volatility: the
// analyzer sees a call by name only, so it must assume the worst overload.
func ddlMostVolatile(sigs map[string]Volatility) Volatility {
	rank := map[Volatility]int{Immutable: 0, Stable: 1, Volatile: 2}
	out := Immutable
	for _, v := range sigs {
		if rank[v] > rank[out] {
			out = v
		}
	}
	return out
}

// ddlDedupKeys drops keys with the same column set as the primary key or an
// earlier key: the column order of an index does not change what it makes
// unique.
func ddlDedupKeys(pk []string, keys [][]string) [][]string {
	var out [][]string
	seen := func(k []string) bool {
		if len(pk) > 0 && ddlSameSet(pk, k) {
			return true
		}
		for _, o := range out {
			if ddlSameSet(o, k) {
				return true
			}
		}
		return false
	}
	for _, k := range keys {
		if len(k) > 0 && !seen(k) {
			out = append(out, ddlClone(k))
		}
	}
	return out
}

func ddlSameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	in := map[string]bool{}
	for _, x := range a {
		in[x] = true
	}
	for _, x := range b {
		if !in[x] {
			return false
		}
	}
	return true
}

func ddlClone(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return append([]string(nil), s...)
}

func ddlSetNotNull(t *Table, cols []string) {
	for _, c := range cols {
		if col := t.Column(c); col != nil {
			col.NotNull = true
		}
	}
}

// ddlMergeColumn adds an inherited or copied column, merging it into a
// column of the same name as PostgreSQL does.
func ddlMergeColumn(t *Table, c Column) {
	if col := t.Column(c.Name); col != nil {
		col.NotNull = col.NotNull || c.NotNull
		return
	}
	t.Columns = append(t.Columns, c)
}

func (ld *ddlLoader) table(rv *pg.RangeVar) *ddlTable {
	return ld.tables[ld.qualify(rv)]
}

// relExists reports whether a relation of any kind has the qualified name:
// tables, views and indexes share one namespace in pg_class.
func (ld *ddlLoader) relExists(q string) bool {
	if ld.tables[q] != nil || ld.views[q] != nil {
		return true
	}
	ix := ld.indexes[q]
	return ix != nil && !ix.dropped
}

func (ld *ddlLoader) qualify(rv *pg.RangeVar) string {
	return ld.qualifySchema(rv.GetSchemaname()) + "." + rv.GetRelname()
}

// qualifySchema maps pg_temp to where temporary relations are kept.
func (ld *ddlLoader) qualifySchema(schema string) string {
	switch schema {
	case "":
		return ld.schema
	case "pg_temp":
		return ddlDefaultSchema
	}
	return schema
}

// qualifyNames qualifies a dotted name list (name, schema.name or
// catalog.schema.name).
func (ld *ddlLoader) qualifyNames(names []string) string {
	switch len(names) {
	case 0:
		return ld.schema + "."
	case 1:
		return ld.schema + "." + names[0]
	}
	return ld.qualifySchema(names[len(names)-2]) + "." + names[len(names)-1]
}

// ddlTypeAliases maps the names a type may be written with to pg_type.typname.
// The parser already rewrites SQL-standard spellings (integer, double
// precision, ...) to pg_catalog.typname; this covers the rest and any
// spelling pg_query may pass through.
var ddlTypeAliases = map[string]string{
	"int": "int4", "integer": "int4", "int4": "int4",
	"bigint": "int8", "int8": "int8",
	"smallint": "int2", "int2": "int2",
	"varchar": "varchar", "character varying": "varchar",
	"character": "bpchar", "bpchar": "bpchar",
	"bool": "bool", "boolean": "bool",
	"real": "float4", "float4": "float4",
	"double precision": "float8", "float": "float8", "float8": "float8",
	"numeric": "numeric", "decimal": "numeric",
	"timestamp": "timestamp", "timestamp without time zone": "timestamp",
	"timestamptz": "timestamptz", "timestamp with time zone": "timestamptz",
	"time without time zone": "time", "time with time zone": "timetz",
}

// ddlSerials are the serial pseudo-types: their column gets the integer type
// and NOT NULL.
var ddlSerials = map[string]string{
	"serial": "int4", "serial4": "int4",
	"bigserial": "int8", "serial8": "int8",
	"smallserial": "int2", "serial2": "int2",
}

// ddlSerial reports whether tn is a serial pseudo-type, which PostgreSQL
// recognizes only as a bare, non-array name.
func ddlSerial(tn *pg.TypeName) bool {
	names := ddlStrings(tn.GetNames())
	return len(names) == 1 && len(tn.GetArrayBounds()) == 0 && ddlSerials[names[0]] != ""
}

// typeName returns a type's pg_type.typname, with domains created in this
// file resolved to their base type, as LoadCatalog resolves them. Quoted
// names keep their case: pg_query already folds unquoted ones, and typname
// keeps the case of a quoted name.
func (ld *ddlLoader) typeName(tn *pg.TypeName) string {
	names := ddlStrings(tn.GetNames())
	if len(names) == 0 {
		return ""
	}
	last := names[len(names)-1]
	typ := last
	builtin := len(names) == 1 || (len(names) == 2 && names[0] == "pg_catalog")
	if builtin {
		if t, ok := ddlTypeAliases[last]; ok {
			typ = t
		} else if t, ok := ddlSerials[last]; ok && len(names) == 1 {
			typ = t
		}
	}
	if len(tn.GetArrayBounds()) > 0 {
		// An array type is named after its element type, domain or not.
		return ddlClip("_" + typ)
	}
	if !(len(names) == 2 && names[0] == "pg_catalog") {
		if base, ok := ld.domains[ld.qualifyNames(names)]; ok {
			return base
		}
	}
	return typ
}

func ddlTypeNames(nodes []*pg.Node) []*pg.TypeName {
	out := make([]*pg.TypeName, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, n.GetTypeName())
	}
	return out
}

func ddlStrings(nodes []*pg.Node) []string {
	out := make([]string, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, n.GetString_().GetSval())
	}
	return out
}

// ddlExprColname is the name PostgreSQL gives an index expression column
// when naming the index: the function's name, else "expr".
func ddlExprColname(el *pg.IndexElem) string {
	if el.GetIndexcolname() != "" {
		return el.GetIndexcolname()
	}
	if names := ddlStrings(el.GetExpr().GetFuncCall().GetFuncname()); len(names) > 0 {
		return names[len(names)-1]
	}
	return "expr"
}

// ddlUniqueColnames makes index column names distinct by appending numbers,
// as ChooseIndexColumnNames does.
func ddlUniqueColnames(names []string) []string {
	out := make([]string, 0, len(names))
	used := map[string]bool{}
	for _, orig := range names {
		cur := orig
		for i := 1; used[cur]; i++ {
			suffix := strconv.Itoa(i)
			cur = ddlClipLen(orig, ddlNameDataLen-1-len(suffix)) + suffix
		}
		used[cur] = true
		out = append(out, cur)
	}
	return out
}

// chooseIndexName returns the name PostgreSQL's ChooseIndexName would give
// an index: table_pkey, table_cols_key or table_cols_idx, made unique in the
// schema with a number.
func (ld *ddlLoader) chooseIndexName(tbl *ddlTable, colnames []string, primary, constraint bool) string {
	label, addition := "idx", ddlIndexNameAddition(colnames)
	switch {
	case primary:
		label, addition = "pkey", ""
	case constraint:
		label = "key"
	}
	mod := label
	for pass := 1; ; pass++ {
		name := ddlMakeObjectName(tbl.relname, addition, mod)
		if !ld.relExists(tbl.schema + "." + name) {
			return name
		}
		mod = label + strconv.Itoa(pass)
	}
}

// ddlIndexNameAddition joins column names with "_", stopping once the
// result reaches NAMEDATALEN, like ChooseIndexNameAddition.
func ddlIndexNameAddition(colnames []string) string {
	var b strings.Builder
	for _, c := range colnames {
		if b.Len() > 0 {
			b.WriteByte('_')
		}
		b.WriteString(ddlClipLen(c, ddlNameDataLen-1))
		if b.Len() >= ddlNameDataLen {
			break
		}
	}
	return b.String()
}

// ddlMakeObjectName is PostgreSQL's makeObjectName: name1_name2_label,
// shortening the longer of name1 and name2 until it fits in NAMEDATALEN-1.
func ddlMakeObjectName(name1, name2, label string) string {
	overhead := 0
	if name2 != "" {
		overhead++
	}
	if label != "" {
		overhead += len(label) + 1
	}
	avail := ddlNameDataLen - 1 - overhead
	n1, n2 := len(name1), len(name2)
	for n1+n2 > avail && n1+n2 > 0 {
		if n1 > n2 {
			n1--
		} else {
			n2--
		}
	}
	out := ddlClipLen(name1, n1)
	if name2 != "" {
		out += "_" + ddlClipLen(name2, n2)
	}
	if label != "" {
		out += "_" + label
	}
	return out
}

// ddlClip cuts an identifier to NAMEDATALEN-1 bytes, as PostgreSQL does.
func ddlClip(s string) string { return ddlClipLen(s, ddlNameDataLen-1) }

// ddlClipLen cuts s to at most n bytes without splitting a character.
func ddlClipLen(s string, n int) string {
	if n < 0 {
		n = 0
	}
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func (ld *ddlLoader) errorf(loc int32, format string, args ...any) error {
	off := int(loc)
	if off < 0 || off > len(ld.sql) {
		off = ddlSkipSpace(ld.sql, ld.stmtStart)
	}
	line, col := ddlLineCol(ld.sql, off)
	return fmt.Errorf("quma: ddl: line %d, column %d: %s", line, col, fmt.Sprintf(format, args...))
}

// ddlSyntaxError locates pg_query's error. Its cursor position counts
// characters, not bytes, from 1.
func ddlSyntaxError(sql string, err error) error {
	var pe *parser.Error
	if !errors.As(err, &pe) {
		return fmt.Errorf("quma: ddl: %w", err)
	}
	se := &SyntaxError{Message: pe.Message, Offset: -1}
	if pe.Cursorpos > 0 {
		se.Offset = ddlRuneOffset(sql, pe.Cursorpos-1)
		se.Line, se.Column = ddlLineCol(sql, se.Offset)
	}
	return se
}

// ddlRuneOffset returns the byte offset of the n-th character of s (from 0),
// or len(s) past its end.
func ddlRuneOffset(s string, n int) int {
	i := 0
	for off := range s {
		if i == n {
			return off
		}
		i++
	}
	return len(s)
}

// ddlLineCol returns the 1-based line and character column of a byte offset.
func ddlLineCol(s string, off int) (line, col int) {
	off = min(max(off, 0), len(s))
	before := s[:off]
	nl := strings.LastIndexByte(before, '\n')
	return strings.Count(before, "\n") + 1, utf8.RuneCountInString(before[nl+1:]) + 1
}

// ddlSkipSpace skips whitespace and comments (which nest in PostgreSQL)
// from off, so that an error points at a statement's first word rather than
// at the end of the previous one.
func ddlSkipSpace(s string, off int) int {
	off = min(max(off, 0), len(s))
	for off < len(s) {
		switch {
		case s[off] == ' ' || s[off] == '\t' || s[off] == '\n' || s[off] == '\r' || s[off] == '\f' || s[off] == '\v':
			off++
		case strings.HasPrefix(s[off:], "--"):
			nl := strings.IndexByte(s[off:], '\n')
			if nl < 0 {
				return len(s)
			}
			off += nl + 1
		case strings.HasPrefix(s[off:], "/*"):
			for depth := 0; off < len(s); {
				switch {
				case strings.HasPrefix(s[off:], "/*"):
					depth++
					off += 2
				case strings.HasPrefix(s[off:], "*/"):
					depth--
					off += 2
				default:
					off++
				}
				if depth == 0 {
					break
				}
			}
		default:
			return off
		}
	}
	return off
}
