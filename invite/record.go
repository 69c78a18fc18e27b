package invite

import (
	"bytes"
	"errors"
	"fmt"
	"slices"

	"github.com/fxamacker/cbor/v2"
	"github.com/ipfs/go-cid"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"gopkg.in/yaml.v3"

	"github.com/p2pnode/p2pnode/cids"
	"github.com/p2pnode/p2pnode/config"
	"github.com/p2pnode/p2pnode/detcbor"
)

// Version is the record format this build writes and reads.
const Version = 1

// MaxRecordBytes bounds an encoded record: the experiment bytes are a config, which
// config.MaxFileBytes bounds, plus a signature and a peer id.
const MaxRecordBytes = config.MaxFileBytes + 4<<10

// Errors a joining node branches on; each is wrapped with the detail.
var (
	// ErrMalformed: the bytes are not a record, or its experiment is not a valid shared config.
	ErrMalformed = errors.New("malformed experiment record")
	// ErrBadSignature: the signature does not verify against the signer's key.
	ErrBadSignature = errors.New("experiment record signature does not verify")
	// ErrNotValidator: the signer is not one of the experiment's validators.
	ErrNotValidator = errors.New("experiment record not signed by one of its validators")
	// ErrNotDialed: the record was signed by a peer other than the one dialed.
	ErrNotDialed = errors.New("experiment record signed by a peer other than the one dialed")
)

// Record is an experiment's shared config signed by one of its validators.
type Record struct {
	Version uint64 `cbor:"1,keyasint"`
	// Experiment is the shared config as YAML (Experiment); its CID (ID) names the
	// experiment.
	Experiment []byte `cbor:"2,keyasint"`
	// Signer is the validator's peer id; its key is in the id (Ed25519).
	Signer string `cbor:"3,keyasint"`
	Sig    []byte `cbor:"4,keyasint"`
}

// signDomain separates these signatures from every other use of a node's key.
const signDomain = "p2pnode/invite/experiment-record/v1\x00"

func signBytes(experiment []byte) []byte {
	return append([]byte(signDomain), experiment...)
}

// ID is the CID of experiment bytes: the experiment's name across restarts and peers.
func ID(experiment []byte) cid.Cid { return cids.Raw(experiment) }

// Sign makes the record of experiment, signed with key.
func Sign(key crypto.PrivKey, experiment []byte) (*Record, error) {
	p, err := peer.IDFromPrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("sign experiment record: %w", err)
	}
	sig, err := key.Sign(signBytes(experiment))
	if err != nil {
		return nil, fmt.Errorf("sign experiment record: %w", err)
	}
	return &Record{Version: Version, Experiment: experiment, Signer: p.String(), Sig: sig}, nil
}

// Encode writes r in deterministic CBOR.
func Encode(r *Record) ([]byte, error) { return detcbor.Marshal(r) }

var decMode = func() cbor.DecMode {
	m, err := detcbor.DecMode(detcbor.Limits{MaxArrayElements: 16, MaxMapPairs: 16, MaxNestedLevels: 4})
	if err != nil {
		panic(err)
	}
	return m
}()

// Decode reads an encoded record strictly (no unknown fields, no trailing bytes). It does
// not check the signature: Verify does.
func Decode(b []byte) (*Record, error) {
	if len(b) > MaxRecordBytes {
		return nil, fmt.Errorf("%w: %d bytes exceeds the %d-byte limit", ErrMalformed, len(b), MaxRecordBytes)
	}
	var r Record
	rest, err := decMode.UnmarshalFirst(b, &r)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformed, err)
	}
	if len(rest) > 0 {
		return nil, fmt.Errorf("%w: %d bytes after the record", ErrMalformed, len(rest))
	}
	if r.Version != Version {
		return nil, fmt.Errorf("%w: version %d; this p2pnode reads version %d (a newer p2pnode may be needed)", ErrMalformed, r.Version, Version)
	}
	if len(r.Experiment) == 0 || len(r.Sig) == 0 || r.Signer == "" {
		return nil, fmt.Errorf("%w: experiment, signer and signature are all required", ErrMalformed)
	}
	return &r, nil
}

// Joined is a verified record: the experiment as a config (defaults under the shared keys,
// no node-local settings yet) and its id.
type Joined struct {
	Record *Record
	ID     cid.Cid
	Config *config.Config
}

// Verify checks that r is a well-formed shared config, signed by a validator it names,
// and that this signer is dialed, the peer the joining node asked. Nothing about r is
// trusted before Verify returns nil.
func Verify(r *Record, dialed peer.ID) (*Joined, error) {
	signer, err := peer.Decode(r.Signer)
	if err != nil {
		return nil, fmt.Errorf("%w: signer %q: %v", ErrMalformed, r.Signer, err)
	}
	pub, err := signer.ExtractPublicKey()
	if err != nil {
		return nil, fmt.Errorf("%w: signer %s: no public key in the peer id: %v", ErrBadSignature, signer, err)
	}
	if ok, err := pub.Verify(signBytes(r.Experiment), r.Sig); err != nil || !ok {
		return nil, fmt.Errorf("%w: signer %s", ErrBadSignature, signer)
	}
	if signer != dialed {
		return nil, fmt.Errorf("%w: dialed %s, signed by %s", ErrNotDialed, dialed, signer)
	}
	var root yaml.Node
	if err := yaml.NewDecoder(bytes.NewReader(r.Experiment)).Decode(&root); err != nil {
		return nil, fmt.Errorf("%w: experiment: %v", ErrMalformed, err)
	}
	if err := checkShared(&root, ""); err != nil {
		return nil, err
	}
	cfg, err := config.Parse(r.Experiment)
	if err != nil {
		return nil, fmt.Errorf("%w: experiment: %v", ErrMalformed, err)
	}
	if len(cfg.Experiment.Validators) == 0 {
		return nil, fmt.Errorf("%w: experiment %s names no validators", ErrNotValidator, cfg.Experiment.ID)
	}
	if !slices.Contains(cfg.Experiment.Validators, signer.String()) {
		return nil, fmt.Errorf("%w: signer %s is not in experiment.validators %v", ErrNotValidator, signer, cfg.Experiment.Validators)
	}
	return &Joined{Record: r, ID: ID(r.Experiment), Config: cfg}, nil
}
