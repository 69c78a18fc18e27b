package config

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// MaxFileBytes bounds a config file.
const MaxFileBytes = 1 << 20

// ErrInvalid is wrapped by every error about config content.
var ErrInvalid = errors.New("invalid config")

// ErrEmpty is a config file with no settings at all. It is refused rather than read as all
// defaults: a file truncated to nothing must not silently start the default experiment.
// A file that means the defaults says so with `{}`.
var ErrEmpty = errors.New("the file holds no settings (truncated?); write `{}` to run every default, or start from `p2pnode init`")

// Load reads, strictly decodes and validates the config at path, applying defaults first,
// then P2PNODE_* environment overrides (ApplyEnv), and resolving relative paths against
// the file's directory.
func Load(path string) (*Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cfg, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	cfg.Path = abs
	if _, err := cfg.ApplyEnv(os.Environ()); err != nil {
		return nil, fmt.Errorf("config %s: environment: %w", path, err)
	}
	cfg.resolvePaths(filepath.Dir(abs))
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

// Parse strictly decodes YAML over the defaults. It does not validate or resolve paths.
func Parse(b []byte) (*Config, error) {
	if len(b) > MaxFileBytes {
		return nil, fmt.Errorf("%w: %d bytes exceeds the %d-byte limit", ErrInvalid, len(b), MaxFileBytes)
	}
	cfg := Default()
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&root); err != nil {
		if errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("%w: %w", ErrInvalid, ErrEmpty)
		}
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if len(root.Content) == 1 && root.Content[0].ShortTag() == "!!null" {
		return nil, fmt.Errorf("%w: %w", ErrInvalid, ErrEmpty)
	}
	lines := map[int]string{}
	var problems []string
	checkKnown(&root, reflect.TypeOf(*cfg), "", lines, &problems)
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w:\n  %s", ErrInvalid, strings.Join(problems, "\n  "))
	}
	// outer_lr left out and outer_lr 0 both mean the default for the codec, so decode over a
	// 0 and fill it in once the file's codec is known.
	cfg.Protocol.DiLoCo.OuterLR = 0
	if err := root.Decode(cfg); err != nil {
		return nil, fmt.Errorf("%w: %s", ErrInvalid, withPaths(err, lines))
	}
	emptyToNil(reflect.ValueOf(cfg).Elem())
	if cfg.Protocol.DiLoCo.OuterLR == 0 {
		cfg.Protocol.DiLoCo.OuterLR = OuterLRFor(cfg.Protocol)
	}
	return cfg, nil
}

// emptyToNil makes `[]` and `{}` in the file mean the same as leaving the field out, so a
// config compares equal however its empty lists are spelt.
func emptyToNil(v reflect.Value) {
	switch v.Kind() {
	case reflect.Struct:
		for i := 0; i < v.NumField(); i++ {
			if v.Type().Field(i).IsExported() {
				emptyToNil(v.Field(i))
			}
		}
	case reflect.Slice, reflect.Map:
		if v.Len() == 0 && !v.IsNil() && v.CanSet() {
			v.Set(reflect.Zero(v.Type()))
		}
	}
}

// checkKnown walks the YAML tree alongside the Go type and reports keys the type does not
// have, by their dotted path, and remembers which path each line holds so that type errors
// from the decoder can name the field too.
func checkKnown(n *yaml.Node, t reflect.Type, path string, lines map[int]string, problems *[]string) {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch n.Kind {
	case yaml.DocumentNode:
		for _, c := range n.Content {
			checkKnown(c, t, path, lines, problems)
		}
	case yaml.MappingNode:
		if t.Kind() == reflect.Map {
			for i := 0; i+1 < len(n.Content); i += 2 {
				k, v := n.Content[i], n.Content[i+1]
				p := join(path, k.Value)
				lines[v.Line] = p
				checkKnown(v, t.Elem(), p, lines, problems)
			}
			return
		}
		if t.Kind() != reflect.Struct {
			return // the decoder reports the type error
		}
		fields := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			p := join(path, k.Value)
			f, ok := fields[k.Value]
			if !ok {
				msg := fmt.Sprintf("%s: unknown field (line %d)", p, k.Line)
				if why, ok := renamed[p]; ok {
					msg = fmt.Sprintf("%s (line %d): %s", p, k.Line, why)
				} else if s := suggest(k.Value, fields); s != "" {
					msg += fmt.Sprintf("; did you mean %q?", s)
				}
				*problems = append(*problems, msg)
				continue
			}
			lines[v.Line] = p
			checkKnown(v, f.Type, p, lines, problems)
		}
	case yaml.ScalarNode:
		if msg := notWhole(n, t); msg != "" {
			*problems = append(*problems, fmt.Sprintf("%s: %s (line %d)", path, msg, n.Line))
		}
	case yaml.SequenceNode:
		if t.Kind() != reflect.Slice {
			return
		}
		for i, c := range n.Content {
			p := fmt.Sprintf("%s[%d]", path, i)
			lines[c.Line] = p
			checkKnown(c, t.Elem(), p, lines, problems)
		}
	}
}

// notWhole says why a number cannot go in an integer setting of type t, "" if it can or t
// is no integer. The YAML decoder truncates 2.9 to 2 without a word; durations are
// strings ("1.5s") and left to it.
func notWhole(n *yaml.Node, t reflect.Type) string {
	if t == durationType || n.ShortTag() != "!!float" {
		return ""
	}
	switch t.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
	default:
		return ""
	}
	f, err := strconv.ParseFloat(strings.ReplaceAll(n.Value, "_", ""), 64)
	if err != nil || f != math.Trunc(f) || math.IsInf(f, 0) {
		return fmt.Sprintf("%s is not a whole number", n.Value)
	}
	return ""
}

var durationType = reflect.TypeOf(time.Duration(0))

// renamed explains fields that older configs used, instead of "unknown field".
var renamed = map[string]string{
	"protocol.ema.decay": "renamed to protocol.ema.new_weight, with the same meaning (the weight of the " +
		"trainers' merged mean; the current model keeps 1 − new_weight). The old name said the opposite of " +
		"the usual convention, where an EMA's decay is the weight of the old value, so it is refused rather " +
		"than silently reinterpreted: write new_weight with the number you had",
}

func yamlFields(t reflect.Type) map[string]reflect.StructField {
	out := map[string]reflect.StructField{}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		name := strings.Split(f.Tag.Get("yaml"), ",")[0]
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = f
	}
	return out
}

// suggest returns the known field closest to a misspelt one, if any is close.
func suggest(got string, fields map[string]reflect.StructField) string {
	best, bestD := "", 3
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	sort.Strings(names)
	for _, k := range names {
		if d := editDistance(got, k); d < bestD {
			best, bestD = k, d
		}
	}
	return best
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur := make([]int, len(b)+1)
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev = cur
	}
	return prev[len(b)]
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

var lineRe = regexp.MustCompile(`line (\d+): `)

// withPaths rewrites "line N: ..." in decoder errors to "field.path: ... (line N)".
func withPaths(err error, lines map[int]string) string {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return err.Error()
	}
	out := make([]string, 0, len(te.Errors))
	for _, e := range te.Errors {
		m := lineRe.FindStringSubmatch(e)
		if m == nil {
			out = append(out, e)
			continue
		}
		n, _ := strconv.Atoi(m[1])
		rest := strings.TrimPrefix(e, m[0])
		if p, ok := lines[n]; ok {
			out = append(out, fmt.Sprintf("%s: %s (line %d)", p, rest, n))
		} else {
			out = append(out, e)
		}
	}
	return strings.Join(out, "; ")
}

// resolvePaths makes relative paths absolute against dir.
func (c *Config) resolvePaths(dir string) {
	abs := func(p *string) {
		if *p != "" && !filepath.IsAbs(*p) && !strings.HasPrefix(*p, "~") {
			*p = filepath.Join(dir, *p)
		}
	}
	abs(&c.Node.StoreDir)
	abs(&c.Node.Identity)
	abs(&c.Dataset.Root)
	abs(&c.Export.Dir)
	// A bare name ("python3") is looked up in PATH; a path with a slash is a file like any
	// other, relative to the config.
	if strings.ContainsRune(c.Workload.Interpreter, filepath.Separator) {
		abs(&c.Workload.Interpreter)
	}
	for i := range c.Workload.PythonPath {
		abs(&c.Workload.PythonPath[i])
	}
	if c.Dataset.Manifest != "" && !filepath.IsAbs(c.Dataset.Manifest) {
		c.Dataset.Manifest = filepath.Join(c.Dataset.Root, c.Dataset.Manifest)
	}
}

// Resolve makes relative paths absolute against dir; for configs not read by Load.
func (c *Config) Resolve(dir string) { c.resolvePaths(dir) }
