package explain

import "errors"

// ErrNoSchema is returned by Statement without a schema.
var ErrNoSchema = errors.New("explain: a schema is required (a live database's catalog, a DDL file, or a QUMA file's)")
