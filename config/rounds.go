package config

// RoundLimitReached reports whether round is at or past the experiment's round limit
// (experiment.rounds; 0: no limit): no round after it is leased or trained, and a node
// whose canonical head is there ends its run.
func RoundLimitReached(rounds int, round uint64) bool {
	return rounds > 0 && round >= uint64(rounds)
}

// RoundLimitReached is RoundLimitReached with this experiment's rounds.
func (e Experiment) RoundLimitReached(round uint64) bool { return RoundLimitReached(e.Rounds, round) }
