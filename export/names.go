package export

import (
	"fmt"
	"regexp"
	"strings"
)

// The names of the files this package reads and writes in a model directory.
const (
	// SingleFile holds the whole model when it fits in one shard.
	SingleFile = "model.safetensors"
	// IndexFile maps tensor names to shard files when the model is sharded (the layout
	// transformers and safetensors tooling expect).
	IndexFile = "model.safetensors.index.json"
	// JournalFile exists only while a sync is applied (or after a crash during one).
	JournalFile = ".p2pnode-export.journal"

	tempPrefix = ".p2pnode-export-"
	tempSuffix = ".tmp"
)

var shardName = regexp.MustCompile(`^model-([0-9]{5})-of-([0-9]{5})\.safetensors$`)

// ShardName is the name of shard i (1-based) of n, as transformers names them.
func ShardName(i, n int) string { return fmt.Sprintf("model-%05d-of-%05d.safetensors", i, n) }

// isModelFile reports whether name is one of the files a model export consists of; only
// such files are ever replaced or removed in a model directory.
func isModelFile(name string) bool {
	return name == SingleFile || name == IndexFile || shardName.MatchString(name)
}

// isTempFile reports whether name is one of our temp files (left over if a write died).
func isTempFile(name string) bool {
	return strings.HasPrefix(name, tempPrefix) && strings.HasSuffix(name, tempSuffix) &&
		!strings.ContainsAny(name, `/\`) && len(name) <= maxNameLen
}

// maxNameLen bounds file names in the journal and the index.
const maxNameLen = 255
