// Package validator owns the validator role: it leads or follows each round — granting
// leases, collecting and screening contributions, merging and proposing the next head, or
// recomputing another validator's proposal bit for bit and attesting it — and never signs
// two heads for one round.
package validator
