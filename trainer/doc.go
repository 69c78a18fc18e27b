// Package trainer owns the trainer role: it trains the windows leased to this node and
// announces their contributions, giving back the leases it cannot finish.
package trainer
