package codecs

import (
	"errors"
	"testing"
)

func TestParse(t *testing.T) {
	for _, c := range All() {
		if got, err := Parse(string(c)); err != nil || got != c {
			t.Errorf("Parse(%q) = %q, %v", c, got, err)
		}
	}
	for _, s := range []string{"", "FP32", "bf16", "int4", "fp32 "} {
		if _, err := Parse(s); !errors.Is(err, ErrUnknown) {
			t.Errorf("Parse(%q): err = %v, want ErrUnknown", s, err)
		}
	}
}

func TestList(t *testing.T) {
	if got := List(); got != "fp32, fp16, int8 or sparse" {
		t.Fatalf("List() = %q", got)
	}
}
