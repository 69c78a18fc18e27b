package pyruntime

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"

	"github.com/p2pnode/p2pnode/internal/atomicfile"
)

// shiftRequest is the file a TrainJob.Shift path receives (docs/worker-protocol.md).
type shiftRequest struct {
	To string `json:"to"`
}

// WriteShift asks the training loop whose TrainJob.Shift is path to move onto the pack at
// to (see TrainJob.Shift). The request appears whole (atomicfile). Whether it was applied
// shows in the loop's TrainResult.ShiftedTo; one that came after the last step is left at
// path for the caller to remove.
func WriteShift(path, to string) error {
	b, err := json.Marshal(shiftRequest{To: to})
	if err != nil {
		return err
	}
	if err := atomicfile.Write(path, b, 0o644); err != nil {
		return fmt.Errorf("pyruntime: shift request: %w", err)
	}
	return nil
}

// TakeShift is the runtime's side of WriteShift, for runtimes written in Go: the pack a
// request at path names, with the request removed, or "" when there is none.
func TakeShift(path string) (string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("pyruntime: shift request: %w", err)
	}
	var r shiftRequest
	if err := json.Unmarshal(b, &r); err != nil || r.To == "" {
		return "", fmt.Errorf("%w: shift request %s: %q", ErrBadRequest, path, b)
	}
	if err := os.Remove(path); err != nil {
		return "", fmt.Errorf("pyruntime: shift request: %w", err)
	}
	return r.To, nil
}
