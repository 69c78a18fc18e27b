// Package progress says how far long work has got (downloads, preparing a dataset,
// catching up on a chain, exports) in words a person reads: sizes, rates and time left.
package progress
