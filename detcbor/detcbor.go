// Package detcbor is the one deterministic-CBOR setup: the encoder every record is written
// and hashed in, and the strict decoders each record type builds with its own limits.
package detcbor

import "github.com/fxamacker/cbor/v2"

// encMode is RFC 8949 core deterministic encoding (fxamacker/cbor CoreDetEncOptions: map
// keys sorted, shortest integers and floats, no indefinite lengths), except that NaN and
// infinities are errors: a record holding one is a bug to surface, not a value to write in
// one of its several encodings. For every value without them the bytes are
// CoreDetEncOptions' own (checkpoint states and artifact manifests, which hold no floats,
// were written with plain CoreDetEncOptions before the three setups became this one).
var encMode = func() cbor.EncMode {
	opts := cbor.CoreDetEncOptions()
	opts.NaNConvert = cbor.NaNConvertReject
	opts.InfConvert = cbor.InfConvertReject
	m, err := opts.EncMode()
	if err != nil { // constant options: cannot fail
		panic(err)
	}
	return m
}()

// Marshal encodes v deterministically.
func Marshal(v any) ([]byte, error) { return encMode.Marshal(v) }

// Limits bound what a decoder accepts; a zero limit is the library's default.
type Limits struct {
	MaxArrayElements int
	MaxMapPairs      int
	MaxNestedLevels  int
	// AllowUnknownFields lets map keys that name no struct field through (they are
	// skipped). Artifact manifests alone are decoded so, as they always were.
	AllowUnknownFields bool
}

// DecMode returns a strict decoder: duplicate map keys and indefinite lengths are errors,
// and so are unknown fields unless l allows them.
func DecMode(l Limits) (cbor.DecMode, error) {
	opts := cbor.DecOptions{
		DupMapKey:         cbor.DupMapKeyEnforcedAPF,
		IndefLength:       cbor.IndefLengthForbidden,
		MaxArrayElements:  l.MaxArrayElements,
		MaxMapPairs:       l.MaxMapPairs,
		MaxNestedLevels:   l.MaxNestedLevels,
		ExtraReturnErrors: cbor.ExtraDecErrorUnknownField,
	}
	if l.AllowUnknownFields {
		opts.ExtraReturnErrors = cbor.ExtraDecErrorNone
	}
	return opts.DecMode()
}
