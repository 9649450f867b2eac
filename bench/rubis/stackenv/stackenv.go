package stackenv

import (
	"bufio"
	"fmt"
	"os"
	"strings"
)

// Read reads the env file at path. It must give LARDER_PG_URL and
// LARDER_DSN; hint says how to start the stack when the file is missing.
func Read(path, hint string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w (start the stack: %s)", err, hint)
	}
	defer f.Close()
	env := map[string]string{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), "="); ok {
			if len(v) >= 2 && v[0] == '\'' && v[len(v)-1] == '\'' {
				v = strings.ReplaceAll(v[1:len(v)-1], `'\''`, "'")
			}
			env[strings.TrimPrefix(k, "export ")] = v
		}
	}
	if env["LARDER_PG_URL"] == "" || env["LARDER_DSN"] == "" {
		return nil, fmt.Errorf("%s lacks LARDER_PG_URL or LARDER_DSN", path)
	}
	return env, sc.Err()
}
