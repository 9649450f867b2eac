package pgfront

import (
	"fmt"
	"strings"
	"sync"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// stmtClass is what the front does with a statement.
type stmtClass int

const (
	// classOther: relayed outside a Larder transaction, refused inside one.
	classOther stmtClass = iota
	// classEmpty: no statement (whitespace, comments, semicolons).
	classEmpty
	// classSelect: a query (SELECT, VALUES, TABLE, WITH … SELECT) without
	// INTO: answered through the library inside a Larder transaction.
	classSelect
	// classAtSnapshot: statements that only read and keep no state past
	// the transaction (SHOW, EXPLAIN, a cursor without HOLD, FETCH, MOVE,
	// CLOSE, EXECUTE of a prepared statement): run at the transaction's
	// snapshot inside a Larder transaction, uncached.
	classAtSnapshot
	// classBeginRO: BEGIN / START TRANSACTION READ ONLY (not SERIALIZABLE):
	// at idle it starts a Larder transaction.
	classBeginRO
	// classBegin: any other BEGIN / START TRANSACTION.
	classBegin
	classCommit   // COMMIT, END (and … AND CHAIN)
	classRollback // ROLLBACK, ABORT (and … AND CHAIN)
	// classSetStaleness: SET [SESSION | LOCAL] larder.staleness,
	// RESET larder.staleness, SET larder.staleness TO DEFAULT.
	classSetStaleness
	classShowStaleness // SHOW larder.staleness
	classDeallocate    // DEALLOCATE [PREPARE] name | ALL
	// classResetAll: RESET ALL and DISCARD ALL reset larder.staleness too
	// (DISCARD ALL also deallocates every prepared statement).
	classResetAll
	// classWrite: INSERT, UPDATE, DELETE, MERGE: refused inside a Larder
	// transaction as PostgreSQL refuses them in a read-only one.
	classWrite
)

// stmtInfo is one statement of a query string, classified.
type stmtInfo struct {
	class stmtClass
	// start is where the statement's text starts in the query string
	// (leading comments and spaces included); text is the statement.
	start int
	text  string
	// command names the statement in messages: "INSERT", "VariableSetStmt".
	command string
	chain   bool // COMMIT/ROLLBACK AND CHAIN
	// Of classSetStaleness: local (SET LOCAL), reset (RESET or TO
	// DEFAULT), value (the value as written).
	local, reset bool
	value        string
	// name is a DEALLOCATE's statement ("" with all); all: DEALLOCATE ALL
	// or DISCARD ALL.
	name string
	all  bool
}

// stalenessParam is the session setting the front answers itself.
const stalenessParam = "larder.staleness"

// classifier parses query strings with PostgreSQL's own parser and keeps
// the answers by text. Safe for concurrent use.
type classifier struct {
	mu sync.Mutex
	// byText holds classifications by query string; cleared when full.
	byText map[string][]stmtInfo
	max    int
}

func newClassifier(max int) *classifier {
	return &classifier{byText: map[string][]stmtInfo{}, max: max}
}

// classify splits sql into its statements and classifies each. A query
// string PostgreSQL's parser refuses returns its error: the caller lets
// PostgreSQL report it.
func (c *classifier) classify(sql string) ([]stmtInfo, error) {
	c.mu.Lock()
	infos, ok := c.byText[sql]
	c.mu.Unlock()
	if ok {
		return infos, nil
	}
	infos, err := classifyText(sql)
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	if len(c.byText) >= c.max {
		clear(c.byText)
	}
	c.byText[sql] = infos
	c.mu.Unlock()
	return infos, nil
}

// classifyText parses sql (never panicking: a parser failure is an error).
func classifyText(sql string) (infos []stmtInfo, err error) {
	defer func() {
		if r := recover(); r != nil {
			infos, err = nil, fmt.Errorf("pgfront: parsing the statement failed: %v", r)
		}
	}()
	res, err := pg.Parse(sql)
	if err != nil {
		return nil, err
	}
	for _, raw := range res.GetStmts() {
		start := int(raw.GetStmtLocation())
		end := len(sql)
		if n := int(raw.GetStmtLen()); n > 0 {
			end = start + n
		}
		if start < 0 || start > end || end > len(sql) {
			return nil, fmt.Errorf("pgfront: statement location %d+%d outside a text of %d bytes", start, end-start, len(sql))
		}
		info := classifyNode(raw.GetStmt())
		info.start, info.text = start, sql[start:end]
		infos = append(infos, info)
	}
	return infos, nil
}

// classifyNode classifies one parsed statement.
func classifyNode(n *pg.Node) stmtInfo {
	info := stmtInfo{class: classOther, command: nodeName(n)}
	switch {
	case n.GetSelectStmt() != nil:
		if n.GetSelectStmt().GetIntoClause() == nil {
			info.class = classSelect
		}
	case n.GetTransactionStmt() != nil:
		classifyTransaction(n.GetTransactionStmt(), &info)
	case n.GetVariableSetStmt() != nil:
		s := n.GetVariableSetStmt()
		switch {
		case s.GetKind() == pg.VariableSetKind_VAR_RESET_ALL:
			info.class, info.all = classResetAll, true
		case strings.EqualFold(s.GetName(), stalenessParam):
			info.class, info.local = classSetStaleness, s.GetIsLocal()
			switch s.GetKind() {
			case pg.VariableSetKind_VAR_SET_VALUE:
				info.value = constText(s.GetArgs())
			case pg.VariableSetKind_VAR_SET_DEFAULT, pg.VariableSetKind_VAR_RESET:
				info.reset = true
			default:
				info.class = classOther
			}
		}
	case n.GetVariableShowStmt() != nil:
		if strings.EqualFold(n.GetVariableShowStmt().GetName(), stalenessParam) {
			info.class = classShowStaleness
		} else {
			info.class = classAtSnapshot
		}
	case n.GetDeallocateStmt() != nil:
		s := n.GetDeallocateStmt()
		info.class, info.name, info.all = classDeallocate, s.GetName(), s.GetIsall()
	case n.GetDiscardStmt() != nil:
		if n.GetDiscardStmt().GetTarget() == pg.DiscardMode_DISCARD_ALL {
			info.class, info.all = classResetAll, true
		}
	case n.GetExplainStmt() != nil, n.GetFetchStmt() != nil, n.GetClosePortalStmt() != nil, n.GetExecuteStmt() != nil:
		info.class = classAtSnapshot
	case n.GetDeclareCursorStmt() != nil:
		// A cursor WITH HOLD outlives the transaction: not at a snapshot
		// the front ends with the transaction.
		const cursorOptHold = 0x0020 // CURSOR_OPT_HOLD, parsenodes.h
		if n.GetDeclareCursorStmt().GetOptions()&cursorOptHold == 0 {
			info.class = classAtSnapshot
		}
	case n.GetInsertStmt() != nil:
		info.class, info.command = classWrite, "INSERT"
	case n.GetUpdateStmt() != nil:
		info.class, info.command = classWrite, "UPDATE"
	case n.GetDeleteStmt() != nil:
		info.class, info.command = classWrite, "DELETE"
	case n.GetMergeStmt() != nil:
		info.class, info.command = classWrite, "MERGE"
	}
	return info
}

func classifyTransaction(s *pg.TransactionStmt, info *stmtInfo) {
	info.chain = s.GetChain()
	switch s.GetKind() {
	case pg.TransactionStmtKind_TRANS_STMT_BEGIN, pg.TransactionStmtKind_TRANS_STMT_START:
		info.class = classBegin
		readOnly, serializable := false, false
		for _, o := range s.GetOptions() {
			d := o.GetDefElem()
			if d == nil {
				continue
			}
			c := d.GetArg().GetAConst()
			switch d.GetDefname() {
			case "transaction_read_only":
				readOnly = c != nil && c.GetIval() != nil && c.GetIval().GetIval() != 0
			case "transaction_isolation":
				serializable = c != nil && c.GetSval() != nil && strings.EqualFold(c.GetSval().GetSval(), "serializable")
			}
		}
		// A SERIALIZABLE read-only transaction promises more than one
		// snapshot does: it stays PostgreSQL's.
		if readOnly && !serializable {
			info.class = classBeginRO
		}
	case pg.TransactionStmtKind_TRANS_STMT_COMMIT:
		info.class = classCommit
	case pg.TransactionStmtKind_TRANS_STMT_ROLLBACK:
		info.class = classRollback
	}
}

// constText is a SET's single value as written: a string, or a number's
// text. Anything else (several values, a list) is "" (invalid).
func constText(args []*pg.Node) string {
	if len(args) != 1 {
		return ""
	}
	c := args[0].GetAConst()
	switch {
	case c == nil:
		return ""
	case c.GetSval() != nil:
		return c.GetSval().GetSval()
	case c.GetIval() != nil:
		return fmt.Sprint(c.GetIval().GetIval())
	case c.GetFval() != nil:
		return c.GetFval().GetFval()
	}
	return ""
}

// nodeName names a statement's kind: "CreateStmt", "VariableSetStmt".
func nodeName(n *pg.Node) string {
	return strings.TrimPrefix(fmt.Sprintf("%T", n.GetNode()), "*pg_query.Node_")
}

// firstKeyword is the first word of a query string in upper case,
// skipping spaces and comments ("(" for a parenthesized query, "" when
// there is none). It tells cheaply whether the string needs parsing.
func firstKeyword(sql string) string {
	i := 0
	for i < len(sql) {
		switch c := sql[i]; {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v':
			i++
		case c == '-' && i+1 < len(sql) && sql[i+1] == '-':
			for i < len(sql) && sql[i] != '\n' {
				i++
			}
		case c == '/' && i+1 < len(sql) && sql[i+1] == '*':
			depth := 0
			for i < len(sql) {
				if i+1 < len(sql) && sql[i] == '/' && sql[i+1] == '*' {
					depth++
					i += 2
				} else if i+1 < len(sql) && sql[i] == '*' && sql[i+1] == '/' {
					depth--
					i += 2
					if depth == 0 {
						break
					}
				} else {
					i++
				}
			}
		case c == '(':
			return "("
		default:
			j := i
			for j < len(sql) && (sql[j] == '_' || sql[j] >= 'a' && sql[j] <= 'z' || sql[j] >= 'A' && sql[j] <= 'Z') {
				j++
			}
			return strings.ToUpper(sql[i:j])
		}
	}
	return ""
}

// singleStatement reports whether sql holds at most one statement, as far
// as a cheap look can tell: a semicolon anywhere but at the end (even
// one in a literal) answers no.
func singleStatement(sql string) bool {
	return !strings.Contains(strings.TrimRight(sql, " \t\r\n\f\v;"), ";")
}

// interceptKeywords start the statements the front may answer itself
// outside a Larder transaction, or must follow (DEALLOCATE, DISCARD).
var interceptKeywords = map[string]bool{
	"BEGIN": true, "START": true, "SET": true, "RESET": true, "SHOW": true, "DEALLOCATE": true, "DISCARD": true,
}
