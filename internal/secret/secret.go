package secret

import (
	"fmt"
	"net/url"
	"os"
	"regexp"
	"strings"
)

// Mask replaces every secret Redact removes.
const Mask = "xxxxx"

// secretParams are URL query and keyword/value parameters that carry
// secrets (PostgreSQL's password, sslpassword and sslkey passphrases;
// tokens and passwords of other clients).
var secretParams = map[string]bool{"password": true, "sslpassword": true, "pass": true, "token": true, "secret": true}

// keywordSecret matches password=… in a keyword/value connection string
// (quoted or not).
var keywordSecret = regexp.MustCompile(`(?i)\b(password|sslpassword|pass|token|secret)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)`)

// RedactURL returns s with its password (user:password@, and secret query
// parameters) masked. A comma-separated list of URLs (NATS accepts one)
// has each redacted. s that is not a URL gets keyword/value redaction.
func RedactURL(s string) string {
	if strings.Contains(s, ",") && strings.Contains(s, "://") && !strings.Contains(s, "?") {
		parts := strings.Split(s, ",")
		for i, p := range parts {
			parts[i] = RedactURL(p)
		}
		return strings.Join(parts, ",")
	}
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" || u.Opaque != "" {
		return keywordSecret.ReplaceAllString(s, "${1}="+Mask)
	}
	if u.User != nil {
		if _, has := u.User.Password(); has {
			u.User = url.UserPassword(u.User.Username(), Mask)
		} else if u.User.Username() != "" && u.Scheme != "postgres" && u.Scheme != "postgresql" {
			// NATS and Redis take a lone token as the user part.
			u.User = url.User(Mask)
		}
	}
	if u.RawQuery != "" {
		q := u.Query()
		changed := false
		for k := range q {
			if secretParams[strings.ToLower(k)] {
				q.Set(k, Mask)
				changed = true
			}
		}
		if changed {
			u.RawQuery = q.Encode()
		}
	}
	return strings.Replace(u.String(), url.QueryEscape(Mask), Mask, -1)
}

// Redact masks, in an arbitrary message (an error from a library, say),
// the credentials of URLs and keyword/value parameters it contains.
func Redact(msg string) string {
	msg = userinfoSecret.ReplaceAllString(msg, "${1}"+Mask+"@")
	return keywordSecret.ReplaceAllString(msg, "${1}="+Mask)
}

// userinfoSecret matches the password of scheme://user:password@ in text.
var userinfoSecret = regexp.MustCompile(`([a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)[^@\s]*@`)

// FromFile reads a secret from path: the file's content without its
// trailing newline. An empty file is an error.
func FromFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("secret: %w", err)
	}
	s := strings.TrimRight(string(b), "\r\n")
	if s == "" {
		return "", fmt.Errorf("secret: %s is empty", path)
	}
	return s, nil
}
