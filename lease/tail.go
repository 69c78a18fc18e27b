package lease

import "math"

// TailSteps shortens the windows of trainers that got fewer microshards than their share
// (perTrainer scaled by relative capacity, as Assign computes it) — at an epoch's tail
// there are not enough left. Their steps shrink in proportion (at least 1), so a trainer
// with one microshard of three neither loops over its data three times nor, since merge
// weights are the samples trained, weighs as much as a full window. steps is not changed.
func TailSteps(steps map[string]int, plan map[string][]uint32, trainers []Trainer, perTrainer int) map[string]int {
	rel := Relative(trainers)
	out := make(map[string]int, len(steps))
	for p, s := range steps {
		out[p] = s
		got, ok := plan[p]
		if !ok || perTrainer <= 0 {
			continue
		}
		share := max(1, int(math.Round(float64(perTrainer)*rel[p])))
		if len(got) < share {
			out[p] = max(1, int(math.Round(float64(s)*float64(len(got))/float64(share))))
		}
	}
	return out
}
