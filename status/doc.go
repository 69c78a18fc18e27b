// Package status owns what a node shows about itself: the status model (Board, Status)
// that the loops update, the Prometheus registry and the node's metrics, the HTTP server
// with /status, /metrics and the dashboard, the progress lines, the peer table and the
// per-round history (rebuilt from the chain, plus this node's own measurements).
package status
