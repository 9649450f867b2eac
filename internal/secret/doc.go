// Package secret keeps credentials out of logs and command lines: it
// redacts the passwords in URLs and connection strings before they are
// logged or put in an error, and reads secrets from files named in flags
// or the environment.
package secret
