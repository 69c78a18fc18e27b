package cids

import (
	"errors"
	"testing"

	"github.com/ipfs/go-cid"
	mh "github.com/multiformats/go-multihash"
)

// The builders' CIDs for fixed bytes: the same as when they lived in artifact.
func TestGoldenCIDs(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  cid.Cid
		want string
	}{
		{"raw", Raw([]byte("hello")), "bafkreibm6jg3ux5qumhcn2b3flc3tyu6dmlb4xa7u5bf44yegnrjhc4yeq"},
		{"record", Record([]byte("hello")), "bafireibm6jg3ux5qumhcn2b3flc3tyu6dmlb4xa7u5bf44yegnrjhc4yeq"},
		{"empty record", Record(nil), "bafireihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"},
	} {
		if tc.got.String() != tc.want {
			t.Errorf("%s: %s, want %s", tc.name, tc.got, tc.want)
		}
	}
}

func TestCheckAndParse(t *testing.T) {
	b := []byte("x")
	sha512, err := cid.V1Builder{Codec: CodecCBOR, MhType: mh.SHA2_512}.Sum(b)
	if err != nil {
		t.Fatal(err)
	}
	v0, err := cid.V0Builder{}.Sum(b)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		c     cid.Cid
		codec uint64
		ok    bool
	}{
		{"record", Record(b), CodecCBOR, true},
		{"raw as raw", Raw(b), cid.Raw, true},
		{"raw as record", Raw(b), CodecCBOR, false},
		{"record as raw", Record(b), cid.Raw, false},
		{"sha2-512", sha512, CodecCBOR, false},
		{"CIDv0", v0, cid.DagProtobuf, false},
		{"undefined", cid.Undef, CodecCBOR, false},
	} {
		err := Check(tc.c, tc.codec)
		if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ErrBadCID)) {
			t.Errorf("%s: Check = %v, want ok %v", tc.name, err, tc.ok)
		}
		if tc.codec != CodecCBOR || tc.c == cid.Undef {
			continue
		}
		c, err := Parse(tc.c.String())
		if tc.ok != (err == nil) || (tc.ok && !c.Equals(tc.c)) {
			t.Errorf("%s: Parse = %s, %v", tc.name, c, err)
		}
	}
	if _, err := Parse("not a cid"); err == nil {
		t.Error("Parse accepted garbage")
	}
}
