package export

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// sampleJournal writes a committed journal with every record kind and returns its bytes.
func sampleJournal(t testing.TB) []byte {
	t.Helper()
	dir := t.TempDir()
	j, err := createJournal(dir, newCounter(nil))
	require.NoError(t, err)
	require.NoError(t, j.block(SingleFile, 4096, 0, bytes.Repeat([]byte{1}, 512)))
	require.NoError(t, j.block(SingleFile, 4096, 3584, bytes.Repeat([]byte{2}, 512)))
	require.NoError(t, j.block(ShardName(1, 2), 100, 96, []byte{3, 3, 3, 3}))
	require.NoError(t, j.rename(tempPrefix+IndexFile+".123"+tempSuffix, IndexFile))
	require.NoError(t, j.remove(ShardName(3, 3)))
	require.NoError(t, j.commit())
	b, err := os.ReadFile(filepath.Join(dir, JournalFile))
	require.NoError(t, err)
	return b
}

func TestJournalRoundTrip(t *testing.T) {
	b := sampleJournal(t)
	var ops []journalOp
	require.NoError(t, decodeJournal(bytes.NewReader(b), int64(len(b)), func(op journalOp) error {
		op.data = bytes.Clone(op.data)
		ops = append(ops, op)
		return nil
	}))
	kinds := ""
	for _, op := range ops {
		kinds += string(op.kind)
	}
	require.Equal(t, "FBBFBRD", kinds)
	require.Equal(t, journalOp{kind: recBlock, name: SingleFile, size: 4096, off: 3584, data: bytes.Repeat([]byte{2}, 512)}, ops[2])
	require.Equal(t, journalOp{kind: recBlock, name: ShardName(1, 2), size: 100, off: 96, data: []byte{3, 3, 3, 3}}, ops[4])
	require.Equal(t, IndexFile, ops[5].name)
	require.Equal(t, ShardName(3, 3), ops[6].name)
}

// TestTornJournalIsNeverCommitted: a journal cut anywhere, or with any byte changed, is
// not applied.
func TestTornJournalIsNeverCommitted(t *testing.T) {
	b := sampleJournal(t)
	for n := range len(b) {
		err := decodeJournal(bytes.NewReader(b[:n]), int64(n), nil)
		require.ErrorIs(t, err, errNotCommitted, "cut at %d", n)
	}
	for i := range b {
		c := bytes.Clone(b)
		c[i] ^= 0x40
		err := decodeJournal(bytes.NewReader(c), int64(len(c)), nil)
		require.ErrorIs(t, err, errNotCommitted, "byte %d changed", i)
	}
	extra := append(bytes.Clone(b), 0)
	require.ErrorIs(t, decodeJournal(bytes.NewReader(extra), int64(len(extra)), nil), errNotCommitted)
}

func TestJournalRefusesNamesOutsideTheModel(t *testing.T) {
	for _, tc := range []struct {
		name string
		kind byte
		body []byte
	}{
		{"block file outside", recFile, append(uvarint(10), "../etc/passwd"...)},
		{"index as block file", recFile, append(uvarint(10), IndexFile...)},
		{"delete foreign", recDelete, []byte("config.json")},
		{"rename from a model file", recRename, append(append(uvarint(uint64(len(SingleFile))), SingleFile...), ShardName(1, 2)...)},
		{"rename onto foreign", recRename, append(append(uvarint(uint64(len(tempPrefix+"x"+tempSuffix))), tempPrefix+"x"+tempSuffix...), "tokenizer.json"...)},
		{"block before its file", recBlock, append(uvarint(0), uvarint(0)...)},
		{"unknown kind", 'Z', nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeRecord(tc.kind, tc.body, nil, nil)
			require.Error(t, err)
		})
	}
	// A block past the end of its file.
	_, err := decodeRecord(recBlock, append(append(uvarint(0), uvarint(98)...), 1, 2, 3), []string{SingleFile}, []int64{100})
	require.ErrorContains(t, err, "outside")
}

func FuzzDecodeJournal(f *testing.F) {
	f.Add(sampleJournal(f))
	f.Add([]byte(journalMagic))
	f.Add([]byte(journalMagic + "F\x05\x0amodel"))
	f.Fuzz(func(t *testing.T, b []byte) {
		var n int
		err := decodeJournal(bytes.NewReader(b), int64(len(b)), func(op journalOp) error {
			n++
			if op.kind == recBlock && (op.off < 0 || op.off+int64(len(op.data)) > op.size) {
				t.Fatalf("block outside its file: %+v", op)
			}
			return nil
		})
		if err == nil && len(b) < len(journalMagic)+1+1+32 {
			t.Fatalf("a %d-byte journal cannot be committed", len(b))
		}
	})
}
