package diloco

import (
	"math"

	"github.com/x448/float16"
)

// The element conversions live here so that Encode (for the error-feedback residual) and
// Decode use exactly the same arithmetic.

// maxHalfBits is the largest finite IEEE half, 65504.
const maxHalfBits = 0x7bff

// toHalf rounds a finite float32 to the nearest half, ties to even. Values beyond the half
// range would round to ±Inf; we saturate them to ±65504 instead, because an Inf on the
// wire would make the whole contribution non-finite and screened out for one outlying
// coordinate, and with error feedback the clipped excess is carried to the next round.
func toHalf(x float32) uint16 {
	h := float16.Fromfloat32(x).Bits()
	if h&0x7fff == 0x7c00 {
		h = h&0x8000 | maxHalfBits
	}
	return h
}

func fromHalf(h uint16) float32 { return float16.Frombits(h).Float32() }

// int8Scale is a block's scale, max|x|/127 in float32. It is 0 for an all-zero block, and
// also when max|x| is so small (below ~64 subnormal steps) that the division underflows;
// such a block decodes to zeros and error feedback keeps its values.
func int8Scale(maxAbs float32) float32 { return maxAbs / 127 }

// quantize returns round-half-away-from-zero(x/scale) clamped to [−127, 127], or 0 when
// scale is 0. The clamp matters: scale is rounded, so the largest |x|/scale can land a hair
// above 127, and a tiny scale can make the quotient overflow to ±Inf.
//
// Clamping first and then truncating |v| + 0.5 is the same function as math.Round plus a
// clamp, only several times faster: for |v| ≤ 127 the float64 sum v ± 0.5 is exact (a
// float32 of that size has no bits below 2⁻³¹), so truncation sees the true value.
func quantize(x, scale float32) int8 {
	if scale == 0 {
		return 0
	}
	v := float64(max(-127, min(127, x/scale)))
	return int8(v + math.Copysign(0.5, v))
}

// dequantize is q·scale with one float32 rounding; the conversion keeps a caller's
// "x − dequantize(…)" from being fused into a multiply-subtract.
func dequantize(q int8, scale float32) float32 { return float32(float32(q) * scale) }

func abs32(x float32) float32 { return math.Float32frombits(math.Float32bits(x) &^ 0x80000000) }
