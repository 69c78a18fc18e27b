//go:build !linux

package artifact

import "os"

// writeback is a no-op where sync_file_range does not exist; the fsync before install
// still makes the data durable.
type writeback struct{}

func startWriteback(*os.File) *writeback { return &writeback{} }
func (*writeback) kick()                 {}
func (*writeback) stop()                 {}
