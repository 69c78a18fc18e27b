// Package e2e holds the end-to-end tests: real p2pnode processes on loopback (the process
// harness) and multi-node docker-compose fleets (behind the e2e build tag).
package e2e
