// Package pack owns parameter packs: the safetensors reader and writer, the pack layout and
// its hash, and zero-copy float32 views of mapped files. A pack is the model's float tensors
// in canonical order (see docs/formats.md); the same values always encode to the same bytes.
package pack
