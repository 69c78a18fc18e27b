package progress

import "fmt"

// Bytes writes n in binary units, three significant digits from KiB up: "512 B",
// "1.50 KiB", "38.1 MiB", "4.00 GiB".
func Bytes(n uint64) string {
	if n < 1024 {
		return fmt.Sprintf("%d B", n)
	}
	units := []string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	v := float64(n) / 1024
	i := 0
	for v >= 1023.5 && i < len(units)-1 { // what would print as 1024 is the next unit
		v /= 1024
		i++
	}
	return sigFigs(v) + " " + units[i]
}

// Count writes n with a decimal suffix: "950", "12.5 k", "1.20 M", "7.00 B" (billion).
func Count(n int64) string {
	if n < 0 {
		return "-" + Count(-n)
	}
	if n < 1000 {
		return fmt.Sprintf("%d", n)
	}
	units := []string{"k", "M", "B", "T"}
	v := float64(n) / 1000
	i := 0
	for v >= 999.5 && i < len(units)-1 {
		v /= 1000
		i++
	}
	return sigFigs(v) + " " + units[i]
}

// sigFigs writes v (1 ≤ v < 1000, or more in the last unit) with three significant
// digits, carrying into the next magnitude when rounding would print 1000.
func sigFigs(v float64) string {
	switch {
	case v < 9.995:
		return fmt.Sprintf("%.2f", v)
	case v < 99.95:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.0f", v)
	}
}
