package fmacheck

import (
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
)

// fusedOp matches the fused multiply-add/subtract instructions of every architecture whose
// Go compiler fuses x*y + z (arm64, ppc64le, s390x, riscv64, loong64, amd64 with v3).
var fusedOp = regexp.MustCompile(`^(V?FN?M(ADD|SUB)[A-Z0-9]*|[VW]FN?M[AS](DB|SB)?|VFML[AS]|X[SV]N?M(ADD|SUB)[A-Z]*)$`)

// TestNoFusedMultiplyAdd compiles the pure math packages for the architectures that fuse
// and fails if a fused instruction appears: one would mean a product that is not wrapped in
// an explicit conversion, and merges or outer steps that differ between an arm64 and an
// amd64 validator.
// We can only run tests on this machine's architecture; the assembly is the next best
// check for the others.
func TestNoFusedMultiplyAdd(t *testing.T) {
	if testing.Short() {
		t.Skip("cross-compiles the package; skipped in -short mode")
	}
	// go test puts its own GOROOT/bin first on PATH, so this is the toolchain under test.
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command to cross-compile with")
	}
	targets := []struct{ goarch, goamd64 string }{
		// riscv64 and loong64 fuse too; they are left out to keep a cold-cache run near
		// a minute (each target cross-compiles the standard library once).
		{"arm64", ""}, {"ppc64le", ""}, {"s390x", ""}, {"amd64", "v3"},
	}
	for _, tg := range targets {
		t.Run(tg.goarch+tg.goamd64, func(t *testing.T) {
			cmd := exec.Command(goBin, "build", "-gcflags=-S", "-o", os.DevNull, "../../merge", "../../diloco", "../parallel")
			// GOFLAGS is cleared so that a -race from the environment cannot break the
			// cgo-less cross build.
			cmd.Env = append(os.Environ(), "GOOS=linux", "GOARCH="+tg.goarch, "CGO_ENABLED=0", "GOFLAGS=")
			if tg.goamd64 != "" {
				cmd.Env = append(cmd.Env, "GOAMD64="+tg.goamd64)
			}
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Fatalf("cross-compile: %v\n%s", err, out)
			}
			text := string(out)
			for _, fn := range []string{"weightedSum", "nesterovStep"} {
				if !strings.Contains(text, fn) {
					t.Fatalf("no assembly of %s in the compiler output; the check would be vacuous", fn)
				}
			}
			for _, line := range strings.Split(text, "\n") {
				// Instruction lines read "\t0x0040 00064 (file.go:12)\tOP\targs".
				_, rest, ok := strings.Cut(line, ")\t")
				if !ok {
					continue
				}
				op, _, _ := strings.Cut(rest, "\t")
				if fusedOp.MatchString(op) {
					t.Errorf("fused instruction: %s", strings.TrimSpace(line))
				}
			}
		})
	}
}
