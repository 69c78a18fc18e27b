// Package fmacheck holds one test: that the pure math packages (merge, diloco and their
// chunk scheduler) compile to no fused multiply-add on any architecture whose Go compiler
// fuses, so validators on arm64 and amd64 merge to the same bits.
package fmacheck
