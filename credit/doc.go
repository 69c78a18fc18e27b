// Package credit owns each peer's account of an experiment as the chain tells it: the
// contributions merged into heads and the samples they trained (heads), the contributions
// rejected and why, and the quarantines (the round notes of the heads' proposers). Every
// node that holds the chain computes the same accounts, so a volunteer can check its own
// on any node. It also turns one trainer's entries in new round notes into what the trainer
// is told (Teller). Pure: no I/O beyond the writer a table is printed to.
//
// What the notes say is their proposer's word (a validator's), not the quorum's: a
// rejection or a quarantine is one validator's local verdict, while a merge is in a head
// the quorum signed.
package credit
