package pyruntime

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The worker's environment keeps freed tensors in glibc's heap unless the user's own
// environment says how malloc should behave.
func TestPythonEnvKeepsTheHeapUnlessTheUserSetsMalloc(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  map[string]string
		want []string // the malloc settings the Python process gets
	}{
		{name: "nothing set", want: []string{"MALLOC_MMAP_MAX_=0", "MALLOC_TRIM_THRESHOLD_=68719476736"}},
		{name: "the user's mmap max wins", set: map[string]string{"MALLOC_MMAP_MAX_": "65536"},
			want: []string{"MALLOC_MMAP_MAX_=65536", "MALLOC_TRIM_THRESHOLD_=68719476736"}},
		{name: "tunables turn it off", set: map[string]string{"GLIBC_TUNABLES": "glibc.malloc.check=0"}, want: nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, k := range []string{"GLIBC_TUNABLES", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_"} {
				if v, ok := tc.set[k]; ok {
					t.Setenv(k, v)
				} else {
					t.Setenv(k, "")
					os.Unsetenv(k)
				}
			}
			// Later entries win, as in exec: keep the last setting of each variable.
			last := map[string]string{}
			for _, kv := range (Options{}).pythonEnv("", nil) {
				if k, _, _ := strings.Cut(kv, "="); strings.HasPrefix(k, "MALLOC_") {
					last[k] = kv
				}
			}
			var got []string
			for _, k := range []string{"MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_"} {
				if kv, ok := last[k]; ok {
					got = append(got, kv)
				}
			}
			require.Equal(t, tc.want, got)
		})
	}
}
