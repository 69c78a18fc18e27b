// Package config owns the experiment config file: its schema, defaults, strict YAML
// decoding (an unknown field is an error naming its path), validation with errors that name
// the field path, and the commented template that `p2pnode init` writes.
package config
