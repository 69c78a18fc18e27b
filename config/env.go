package config

import (
	"fmt"
	"reflect"
	"sort"
	"strings"

	"gopkg.in/yaml.v3"
)

// EnvPrefix starts every environment variable that overrides a config key: the key's dotted
// path in upper case with underscores, e.g. P2PNODE_NODE_LISTEN for node.listen. Containers
// configure a node this way without editing its file.
const EnvPrefix = "P2PNODE_"

// EnvName is the environment variable that overrides the config key at path ("node.listen").
func EnvName(path string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(path, ".", "_"))
}

// envKeys maps each overridable variable to its key's path: every field of Config, nested
// structs by their leaves, and lists, maps and values whole.
var envKeys = func() map[string]string {
	out := map[string]string{}
	var walk func(t reflect.Type, path string)
	walk = func(t reflect.Type, path string) {
		if t.Kind() == reflect.Struct && t != reflect.TypeOf(Devices{}) {
			for name, f := range yamlFields(t) {
				walk(f.Type, join(path, name))
			}
			return
		}
		out[EnvName(path)] = path
	}
	walk(reflect.TypeOf(Config{}), "")
	return out
}()

// envSections are the variable prefixes of the config's sections (P2PNODE_NODE_, ...): a
// variable under one that names no key is a typo to report. Other P2PNODE_ variables
// belong to other tools (scripts, tests) and are left alone.
var envSections = func() []string {
	var out []string
	for name := range yamlFields(reflect.TypeOf(Config{})) {
		out = append(out, EnvName(name)+"_")
	}
	return out
}()

// ApplyEnv sets the config keys named by P2PNODE_* variables in environ (os.Environ's
// form). Each value is YAML, as it would be written in the file (`[/ip4/0.0.0.0/tcp/4001]`,
// `30s`, `cuda`). It returns the keys it set, sorted.
func (c *Config) ApplyEnv(environ []string) ([]string, error) {
	var set, problems []string
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, EnvPrefix) {
			continue
		}
		path, ok := envKeys[name]
		if !ok {
			for _, sec := range envSections {
				if strings.HasPrefix(name, sec) {
					problems = append(problems, fmt.Sprintf("%s: names no config key%s", name, suggestEnv(name)))
					break
				}
			}
			continue
		}
		if err := c.setYAML(path, value); err != nil {
			problems = append(problems, fmt.Sprintf("%s (from %s): %v", path, name, err))
			continue
		}
		set = append(set, path)
	}
	sort.Strings(set)
	sort.Strings(problems)
	if len(problems) > 0 {
		return nil, fmt.Errorf("%w:\n  %s", ErrInvalid, strings.Join(problems, "\n  "))
	}
	return set, nil
}

// setYAML decodes value (YAML) into the field at the dotted path, replacing what was there.
func (c *Config) setYAML(path, value string) error {
	v := reflect.ValueOf(c).Elem()
	for _, key := range strings.Split(path, ".") {
		f, ok := yamlFields(v.Type())[key]
		if !ok {
			return fmt.Errorf("unknown field")
		}
		v = v.FieldByIndex(f.Index)
	}
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(value), &n); err != nil {
		return err
	}
	fresh := reflect.New(v.Type())
	if len(n.Content) > 0 {
		var problems []string
		checkKnown(&n, v.Type(), path, map[int]string{}, &problems)
		if len(problems) > 0 {
			return fmt.Errorf("%s", strings.Join(problems, "; "))
		}
		if err := n.Content[0].Decode(fresh.Interface()); err != nil {
			return err
		}
	}
	v.Set(fresh.Elem())
	emptyToNil(v)
	return nil
}

// suggestEnv names the overridable variable closest to a misspelt one, if any is close.
func suggestEnv(name string) string {
	best, bestD := "", 3
	for k := range envKeys {
		if d := editDistance(name, k); d < bestD || (d == bestD && best != "" && k < best) {
			best, bestD = k, d
		}
	}
	if best == "" {
		return " (a section's keys are set one by one, e.g. P2PNODE_NODE_LISTEN)"
	}
	return fmt.Sprintf("; did you mean %s?", best)
}
