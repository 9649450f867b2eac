// Package stackenv reads the local stack's env file (stack.env, written by
// deploy/local): KEY=value lines, each value in single quotes, a quote
// inside it written the shell's way (close, escaped quote, reopen).
package stackenv
