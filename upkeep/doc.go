// Package upkeep keeps a node's store in shape while it runs: the checkpoint keeper
// (Keeper) turns the node's state into checkpoint snapshots and restores them, and the
// pruner (Pruner) deletes the artifacts no kept head, checkpoint or open round needs.
package upkeep
