package dataset

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/p2pnode/p2pnode/cids"
)

func validManifest() *Manifest {
	return &Manifest{Version: 1, Name: "digits", Files: []File{
		{Path: "a.npz", Bytes: 10, Examples: 2, CID: fakeCID("a")},
		{Path: "sub/b.npz", Bytes: 20, CID: fakeCID("b")},
	}}
}

func TestValidate(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(m *Manifest)
		wantErr string // empty: valid
	}{
		{"valid", func(*Manifest) {}, ""},
		{"no files", func(m *Manifest) { m.Files = nil }, ""},
		{"wrong version", func(m *Manifest) { m.Version = 2 }, "version 2"},
		{"empty name", func(m *Manifest) { m.Name = "" }, "name"},
		{"absolute path", func(m *Manifest) { m.Files[0].Path = "/etc/passwd" }, "relative"},
		{"dot-dot escape", func(m *Manifest) { m.Files[0].Path = "../x" }, "relative"},
		{"dot-dot inside", func(m *Manifest) { m.Files[0].Path = "sub/../../x" }, "relative"},
		{"dot element", func(m *Manifest) { m.Files[0].Path = "./a" }, "relative"},
		{"empty element", func(m *Manifest) { m.Files[0].Path = "sub//a" }, "relative"},
		{"trailing slash", func(m *Manifest) { m.Files[0].Path = "sub/" }, "relative"},
		{"dot", func(m *Manifest) { m.Files[0].Path = "." }, "empty"},
		{"empty path", func(m *Manifest) { m.Files[0].Path = "" }, "empty"},
		{"backslash", func(m *Manifest) { m.Files[0].Path = `..\..\x` }, "backslash"},
		{"NUL", func(m *Manifest) { m.Files[0].Path = "a\x00b" }, "NUL"},
		{"invalid UTF-8", func(m *Manifest) { m.Files[0].Path = "a\xffb" }, "UTF-8"},
		{"duplicate path", func(m *Manifest) { m.Files[1].Path = "a.npz" }, "listed twice"},
		{"negative bytes", func(m *Manifest) { m.Files[0].Bytes = -1 }, "negative"},
		{"negative examples", func(m *Manifest) { m.Files[0].Examples = -1 }, "negative"},
		{"garbage cid", func(m *Manifest) { m.Files[0].CID = "bafkqzz" }, "parse artifact id"},
		{"raw cid is not an artifact id", func(m *Manifest) { m.Files[0].CID = cids.Raw([]byte("a")).String() }, "codec"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := validManifest()
			tt.edit(m)
			err := m.Validate()
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("unexpected error: %v", err)
				}
				return
			}
			if !errors.Is(err, ErrInvalidManifest) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("err = %v, want ErrInvalidManifest mentioning %q", err, tt.wantErr)
			}
		})
	}
}

func TestDecode(t *testing.T) {
	valid := `{"version": 1, "name": "digits", "files": [{"path": "a.npz", "bytes": 4711, "examples": 64, "cid": "` + fakeCID("a") + `"}]}`
	tests := []struct {
		name    string
		in      string
		wantErr bool
	}{
		{"formats.md example shape", valid, false},
		{"trailing whitespace", valid + "\n\n", false},
		{"unknown field", strings.Replace(valid, `"name"`, `"extra": 1, "name"`, 1), true},
		{"trailing data", valid + "{}", true},
		{"not JSON", "version: 1", true},
		{"null", "null", true},
		{"bytes overflow int64", strings.Replace(valid, "4711", "9223372036854775808", 1), true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode([]byte(tt.in))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, wantErr %v", err, tt.wantErr)
			}
		})
	}
}

func TestWriteLoadRoundTrip(t *testing.T) {
	m := validManifest()
	path := filepath.Join(t.TempDir(), "manifest.json")
	if err := m.Write(path); err != nil {
		t.Fatal(err)
	}
	got, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	wantID, _ := m.ID()
	gotID, _ := got.ID()
	if !wantID.Equals(gotID) {
		t.Fatalf("id changed across write/load: %s → %s", wantID, gotID)
	}
	// The file holds exactly the canonical bytes, so anyone can check it against the id.
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if fileID := cids.Raw(b); !fileID.Equals(wantID) {
		t.Fatalf("file hashes to %s, manifest id is %s", fileID, wantID)
	}
}

func TestWriteRefusesInvalid(t *testing.T) {
	m := validManifest()
	m.Files[0].Path = "../escape"
	path := filepath.Join(t.TempDir(), "manifest.json")
	if err := m.Write(path); err == nil {
		t.Fatal("invalid manifest written")
	}
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("file exists after refused write: %v", err)
	}
}

func TestIDIgnoresFormattingOnly(t *testing.T) {
	m := validManifest()
	canon, err := m.Canonical()
	if err != nil {
		t.Fatal(err)
	}
	compact := strings.Join(strings.Fields(string(canon)), "")
	other, err := Decode([]byte(compact))
	if err != nil {
		t.Fatal(err)
	}
	a, _ := m.ID()
	b, _ := other.ID()
	if !a.Equals(b) {
		t.Fatalf("reformatting changed the id: %s vs %s", a, b)
	}

	tests := []struct {
		name string
		edit func(m *Manifest)
	}{
		{"name", func(m *Manifest) { m.Name = "other" }},
		{"order", func(m *Manifest) { m.Files[0], m.Files[1] = m.Files[1], m.Files[0] }},
		{"examples", func(m *Manifest) { m.Files[1].Examples = 5 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := validManifest()
			tt.edit(c)
			id, _ := c.ID()
			if id.Equals(a) {
				t.Fatalf("changing %s kept the id", tt.name)
			}
		})
	}
}

func TestNilAndEmptyFilesSameID(t *testing.T) {
	a, _ := (&Manifest{Version: 1, Name: "x"}).ID()
	b, _ := (&Manifest{Version: 1, Name: "x", Files: []File{}}).ID()
	if !a.Equals(b) {
		t.Fatal("nil and empty file lists give different ids")
	}
}

func TestLoadMissing(t *testing.T) {
	_, err := Load(filepath.Join(t.TempDir(), "nope.json"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("err = %v, want not-exist", err)
	}
}
