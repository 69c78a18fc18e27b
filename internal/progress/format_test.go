package progress

import "testing"

func TestBytes(t *testing.T) {
	for _, tc := range []struct {
		n    uint64
		want string
	}{
		{0, "0 B"},
		{1023, "1023 B"},
		{1024, "1.00 KiB"},
		{1536, "1.50 KiB"},
		{10*1024 - 1, "10.0 KiB"},
		{40 << 20, "40.0 MiB"},
		{4 << 30, "4.00 GiB"},
		{1<<30 - 1, "1.00 GiB"},
		{1000 << 20, "1000 MiB"},
		{3 << 40, "3.00 TiB"},
		{^uint64(0), "16.0 EiB"},
	} {
		if got := Bytes(tc.n); got != tc.want {
			t.Errorf("Bytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}

func TestCount(t *testing.T) {
	for _, tc := range []struct {
		n    int64
		want string
	}{
		{0, "0"},
		{999, "999"},
		{1000, "1.00 k"},
		{12_500, "12.5 k"},
		{1_204_000, "1.20 M"},
		{124_000_000, "124 M"},
		{7_000_000_000, "7.00 B"},
		{999_999_999, "1.00 B"},
		{-1500, "-1.50 k"},
	} {
		if got := Count(tc.n); got != tc.want {
			t.Errorf("Count(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}
