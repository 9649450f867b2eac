package publisher

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// PrivilegeError says the invalidator's role lacks a privilege it needs
// (to create the publication, to replicate) and how to grant it. Retrying
// cannot help: the invalidator stops.
type PrivilegeError struct {
	What  string   // what could not be done
	Err   error    // PostgreSQL's refusal
	Fixes []string // statements, any one of which (or all, see Error) fixes it
	Hint  string   // how to read Fixes
}

func (e *PrivilegeError) Error() string {
	var b strings.Builder
	b.WriteString("invalidator: " + e.What + ": " + e.Err.Error() + "\n")
	b.WriteString(e.Hint + "\n")
	for _, f := range e.Fixes {
		b.WriteString("  " + f + "\n")
	}
	return strings.TrimRight(b.String(), "\n")
}

func (e *PrivilegeError) Unwrap() error { return e.Err }

// insufficientPrivilege reports PostgreSQL's insufficient_privilege.
func insufficientPrivilege(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "42501"
}

// roleAndDatabase names the connection's role and database, quoted for
// SQL ("role" and "database" when they cannot be read).
func roleAndDatabase(ctx context.Context, conn *pgx.Conn) (role, db string) {
	role, db = "role", "database"
	var r, d string
	if err := conn.QueryRow(ctx, `SELECT current_user::text, current_database()::text`).Scan(&r, &d); err == nil {
		role, db = pgx.Identifier{r}.Sanitize(), pgx.Identifier{d}.Sanitize()
	}
	return role, db
}

// publicationPrivilegeError explains a refused CREATE PUBLICATION:
// FOR ALL TABLES needs a superuser; FOR TABLE needs CREATE on the
// database and ownership of the tables.
func (p *Publisher) publicationPrivilegeError(ctx context.Context, conn *pgx.Conn, create string, err error) *PrivilegeError {
	role, db := roleAndDatabase(ctx, conn)
	e := &PrivilegeError{What: "role " + role + " may not create the publication " + pgx.Identifier{p.cfg.Publication}.Sanitize(), Err: err}
	if len(p.cfg.Tables) == 0 {
		e.Hint = "a publication FOR ALL TABLES can only be created by a superuser; create it once as a superuser (the invalidator uses an existing publication):"
		e.Fixes = []string{create + ";"}
		return e
	}
	e.Hint = "create it once as a superuser (the invalidator uses an existing publication), or let the role create it: it needs CREATE on the database and must own the tables:"
	e.Fixes = []string{create + ";", "GRANT CREATE ON DATABASE " + db + " TO " + role + ";"}
	return e
}

// replicationPrivilegeError explains a refused replication connection.
func replicationPrivilegeError(ctx context.Context, conn *pgx.Conn, err error) *PrivilegeError {
	role, _ := roleAndDatabase(ctx, conn)
	return &PrivilegeError{
		What:  "role " + role + " may not open a replication connection",
		Err:   err,
		Hint:  "grant it the REPLICATION attribute (as a superuser):",
		Fixes: []string{"ALTER ROLE " + role + " REPLICATION;"},
	}
}
