// Package lease owns who trains what: the round leader choice, lease issue, expiry and
// reassignment, and the microshard ledger that proves every microshard is trained exactly
// once per epoch. It does not touch the network.
//
// # No round held hostage
//
// A round's leader keeps a Book of the round. A trainer whose contribution is rejected (at
// acceptance or by screening), whose lease expires, or who gives its lease back (a gossip
// Release: its worker failed) is barred from the rest of the round, and the lease's
// microshards go back to the pool for the others. An attempt ends as soon as all its
// leases are settled, not only at its deadline. The round then closes with what passed once
// it has the minimum group (or every leased trainer reported, or no microshard is left);
// otherwise it leases again to trainers that are not barred, and when none is left it waits
// one round deadline for trainers to join before closing with what it has. Each trainer
// gets at most one attempt per pass, so however fast attempts fail, a pass has no more of
// them than there are trainers. Only when nothing at all was received and every live
// trainer is barred does a new pass readmit them, after a backoff that doubles with each
// pass (3 s up to 24 s), so honest updates that screening happened to reject do not stall
// the run, and nothing a peer sends makes the leader spin.
//
// One exception brings a trainer back within its round: one that left — its process
// restarted (it announces a new start time) or it fell silent — settles its lease at once
// (its microshards go back to the pool without waiting out the deadline), and when it is
// heard from again it is readmitted, if it was barred only for leaving or for an expired
// lease, at most Book.Returns times a round (once by default). A trainer whose
// contribution was rejected or who released its lease stays out however often it
// reconnects, so a trainer can add at most Returns attempts to a pass by leaving and
// coming back, and each departure costs it the time to restart and a miss toward
// quarantine.
//
// # Deadlines from what is known
//
// An attempt's deadline (Deadline) is three times the slowest expected window plus slack:
// each leased trainer's steps times its seconds per step as this validator observed them,
// else as the trainer announces them (its worker's probe or its own windows), else the
// median of the known ones; with no pace known at all it is lease.first_deadline. A trainer
// that stayed (heard from, the same process) and let a lease of the round expire gets at
// least twice the deadline it missed (Pace.Missed): its pace may have been observed on an
// idle machine that is loaded now. One killed or restarted meanwhile does not: its silence
// said nothing of the deadline. Always between lease.min_deadline and lease.round_timeout.
//
// # A window's worth of data
//
// A trainer's share is lease.microshards_per_trainer, raised to the microshards one window
// (inner_steps × samples per step) reads without repeating an example (WindowShare), as
// long as the epoch's plan holds that many for every trainer. Where it does not, the share
// stays as configured and windows repeat their examples: an even split of a small epoch
// among a small fleet gives each trainer half the data a round, and their updates on a
// converged model point apart (the cohort screen rejects them). The epoch's last full round
// takes a leftover of up to half a round with it (AbsorbTail raises its share, WindowSteps
// lengthens its windows), so no round is only short windows. A larger leftover is a tail
// round: AssignWithin leases what is left (fewer or smaller leases) and WindowSteps shrinks
// each short lease's steps against the share, so a tail window neither repeats its data nor
// outweighs a full one.
//
// # A window ahead
//
// With protocol.overlap: eager a lease also reserves its trainer's microshards for the
// next round (Lease.Next, NextSteps), drawn from what the round leaves: the trainer trains
// them while the round closes, and the next round's leader leases them to it again when its
// update was merged and they are still available (validator/overlap.go). A reservation is a
// hint, not a grant: Check validates it, the ledger ignores it.
//
// # Updates that disagree
//
// A closing that rejects two or more updates for pointing away from each other (a young
// chain's pair, held to each other) makes the round lease one trainer per attempt from
// then on (Book.Disagreed, OneOf): a retry on the same base and data disagrees again.
//
// Misses (expired or released leases) count toward Quarantine like soft rejections, and at
// an epoch's tail, when microshards are fewer than trainers, trainers whose contributions
// were merged recently are served before those that merely announce a high capacity.
package lease
