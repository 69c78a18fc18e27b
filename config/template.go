package config

import _ "embed"

// Template is the commented config `p2pnode init` writes; it spells out every default.
//
//go:embed template.yaml
var Template []byte
