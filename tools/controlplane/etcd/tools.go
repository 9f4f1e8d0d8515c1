//go:build tools

// Package tools pins the command this module builds: an unmodified etcd server.
package tools

import _ "go.etcd.io/etcd/server/v3"
