package quma

import (
	"fmt"
	"sort"
	"strings"
	"sync"

	pg "github.com/pganalyze/pg_query_go/v6"
	"google.golang.org/protobuf/proto"
)

// Analyzer prepares SQL texts into Templates against a schema and the tag
// column sets of a QUMA solution. Safe for concurrent use.
type Analyzer struct {
	schema  *Schema
	tagSets map[string][][]string

	mu    sync.RWMutex
	cache map[string]*Template // guarded by mu; SQL text → template
}

// maxCached bounds the prepared-text cache: applications that inline
// literals produce unbounded distinct texts. When full it starts over.
const maxCached = 20000

// NewAnalyzer returns an analyzer that keys dependencies on tagSets (table →
// column sets); a nil map gives table tags only.
func NewAnalyzer(schema *Schema, tagSets map[string][][]string) *Analyzer {
	if schema == nil {
		schema = NewSchema()
	}
	return &Analyzer{schema: schema, tagSets: tagSets, cache: map[string]*Template{}}
}

// Prepare analyzes sql, once per distinct text: later calls return the same
// *Template from a map. Syntax errors are *SyntaxError with the position.
func (a *Analyzer) Prepare(sql string) (*Template, error) {
	a.mu.RLock()
	t, ok := a.cache[sql]
	a.mu.RUnlock()
	if ok {
		return t, nil
	}
	t, _, err := analyzeSQL(a.schema, sql, a.tagSets)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	if len(a.cache) >= maxCached {
		a.cache = map[string]*Template{}
	}
	a.cache[sql] = t
	a.mu.Unlock()
	return t, nil
}

// analyzeSQL analyzes one SQL text. It also returns the offline proposals
// (table → column set) its bindings suggest.
func analyzeSQL(schema *Schema, sql string, sets map[string][][]string) (t *Template, proposals map[string][][]string, err error) {
	defer func() {
		// The parser and analysis must never take the caller down; a panic
		// here is a bug, reported as an error on this statement.
		if r := recover(); r != nil {
			t, proposals, err = nil, nil, fmt.Errorf("quma: internal error analyzing statement: %v", r)
		}
	}()
	res, err := pg.Parse(sql)
	if err != nil {
		return nil, nil, newSyntaxError(sql, err)
	}
	stmts := res.GetStmts()
	if len(stmts) == 0 {
		return nil, nil, ErrEmpty
	}
	t = &Template{}
	if t.ID, err = pg.Fingerprint(sql); err != nil {
		return nil, nil, newSyntaxError(sql, err)
	}
	if t.SQL, err = pg.Normalize(sql); err != nil {
		t.SQL = sql
	}
	t.SQL = strings.TrimSpace(t.SQL)
	t.NumParams = maxParam(res)
	if len(stmts) > 1 {
		t.Kind = KindOther
		t.Reason = fmt.Sprintf("holds %d statements", len(stmts))
		for _, s := range stmts {
			t.Writes = append(t.Writes, writesOf(schema, s.GetStmt())...)
		}
		if len(t.Writes) > 0 {
			t.Kind = KindWrite
		}
		return t, nil, nil
	}
	n := stmts[0].GetStmt()
	t.SessionNeutral = sessionNeutral(schema, n)
	if sel := n.GetSelectStmt(); sel != nil {
		t.Kind = KindQuery
		an := &analysis{schema: schema, root: n, sql: sql, numParams: t.NumParams}
		an.selectStmt(sel, nil)
		an.checkCacheable(n)
		t.Writes = writesOf(schema, n) // data-modifying CTEs
		if len(t.Writes) > 0 {
			t.Kind = KindWrite
			an.refuse("writes (a data-modifying WITH)")
		}
		t.Rewrite = an.rewrite
		if len(an.uncacheable) == 0 && an.clock {
			if t.ClockSQL = clockSQL(schema, sql, t.NumParams); t.ClockSQL == "" {
				an.refuse("reads the clock in a form that cannot be fixed to a bucket")
				t.Rewrite = timeRewrite
			}
		}
		if len(an.uncacheable) > 0 {
			t.Reason = strings.Join(uniqueStrings(an.uncacheable), "; ")
			t.ClockSQL = ""
		} else {
			t.Cacheable = true
		}
		t.Deps = buildDeps(an.refs, sets)
		proposals = map[string][][]string{}
		for _, r := range an.refs {
			if p := proposal(r); p != nil {
				proposals[r.name] = append(proposals[r.name], p)
			}
		}
		return t, proposals, nil
	}
	t.Writes = writesOf(schema, n)
	if len(t.Writes) > 0 {
		t.Kind = KindWrite
		t.Reason = "writes"
		return t, nil, nil
	}
	t.Kind = KindOther
	t.Reason = "not a query (" + nodeName(n) + ")"
	return t, nil, nil
}

// writesOf lists the tables (and columns) a statement changes, including
// writes nested in CTEs.
func writesOf(schema *Schema, n *pg.Node) []Write {
	var out []Write
	add := func(rv *pg.RangeVar, w Write) {
		if rv == nil {
			return
		}
		q, _, _ := schema.Resolve(rv.GetSchemaname(), rv.GetRelname())
		w.Table = q
		out = append(out, w)
	}
	walk(n, func(m proto.Message) bool {
		switch x := m.(type) {
		case *pg.InsertStmt:
			add(x.GetRelation(), Write{AllColumns: true})
		case *pg.DeleteStmt:
			add(x.GetRelation(), Write{AllColumns: true})
		case *pg.MergeStmt:
			add(x.GetRelation(), Write{AllColumns: true})
		case *pg.UpdateStmt:
			var cols []string
			seen := map[string]bool{}
			for _, t := range x.GetTargetList() {
				if rt := t.GetResTarget(); rt != nil && !seen[rt.GetName()] {
					seen[rt.GetName()] = true
					cols = append(cols, rt.GetName())
				}
			}
			sort.Strings(cols)
			add(x.GetRelation(), Write{Columns: cols})
		case *pg.TruncateStmt:
			for _, r := range x.GetRelations() {
				add(r.GetRangeVar(), Write{AllColumns: true, Truncate: true})
			}
		}
		return true
	})
	return out
}

func maxParam(res *pg.ParseResult) int {
	highest := 0
	walk(res, func(m proto.Message) bool {
		if p, ok := m.(*pg.ParamRef); ok && int(p.GetNumber()) > highest {
			highest = int(p.GetNumber())
		}
		return true
	})
	return highest
}

// nodeName names a statement's kind: "CreateStmt", "VariableSetStmt".
func nodeName(n *pg.Node) string {
	name := fmt.Sprintf("%T", n.GetNode())
	name = strings.TrimPrefix(name, "*pg_query.Node_")
	return name
}

func uniqueStrings(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}
