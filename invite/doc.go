// Package invite owns the experiment record a volunteer joins by: the shared part of an
// experiment's config (experiment, dataset, workload, protocol, merge and lease rules;
// never node-local settings or secrets) as YAML, signed by one of the experiment's
// validators, served over ProtocolID, and checked by the joining node against the peer it
// dialed. The record's experiment bytes are content-addressed: their CID names the
// experiment, so a joined node notices when the experiment it joined has changed.
package invite
