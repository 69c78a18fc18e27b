package status

import _ "embed"

// dashboardHTML is the page served at /: it polls /status and draws loss and held-out
// metrics per round, the peers, the head and the leases.
//
//go:embed dashboard.html
var dashboardHTML []byte
