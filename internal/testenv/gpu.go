package testenv

import (
	"fmt"
	"testing"
)

// NoGPU skips t because the machine has no usable GPU. Unlike Missing it skips under
// CI=true too: a machine without a GPU is not a broken setup (CI runners and these
// development machines have none), so GPU tests can only run where one exists, and a
// skip says so rather than pretending the test ran.
func NoGPU(t testing.TB, format string, args ...any) {
	t.Helper()
	t.Skip("no GPU: " + fmt.Sprintf(format, args...))
}
