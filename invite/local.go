package invite

import (
	"bytes"
	"fmt"
	"reflect"
	"sort"

	"gopkg.in/yaml.v3"
)

// Local is a joining node's own settings: everything the record leaves out that it sets.
type Local struct {
	StoreDir  string
	Listen    []string
	HTTP      string
	Bootstrap []string
	Roles     []string
	Device    string
	// DatasetRoot is where the dataset is kept (dataset.root).
	DatasetRoot string
}

// LocalConfig writes the config a joining node runs with: its Local settings and the
// experiment bytes, verbatim, under a header naming where they came from.
func LocalConfig(experiment []byte, signer string, l Local) ([]byte, error) {
	var doc yaml.Node
	if err := yaml.Unmarshal(experiment, &doc); err != nil || len(doc.Content) != 1 || doc.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%w: experiment is not a YAML mapping", ErrMalformed)
	}
	root := doc.Content[0]
	node := &yaml.Node{Kind: yaml.MappingNode}
	for _, kv := range []struct {
		k string
		v any
	}{{"store_dir", l.StoreDir}, {"listen", l.Listen}, {"http", l.HTTP}, {"bootstrap", l.Bootstrap}} {
		if err := addKey(node, kv.k, kv.v, false); err != nil {
			return nil, err
		}
	}
	root.Content = append([]*yaml.Node{{Kind: yaml.ScalarNode, Value: "node", HeadComment: "This node's own settings (yours to change)."}, node}, root.Content...)
	if err := addKey(section(root, "experiment"), "roles", l.Roles, true); err != nil {
		return nil, err
	}
	if err := addKey(section(root, "workload"), "device", l.Device, true); err != nil {
		return nil, err
	}
	if err := addKey(section(root, "dataset"), "root", l.DatasetRoot, true); err != nil {
		return nil, err
	}
	root.Content[2].HeadComment = "The experiment's, as its validator signed it: `p2pnode join --update` replaces it."
	var buf bytes.Buffer
	fmt.Fprintf(&buf, "# Written by `p2pnode join` from experiment %s, signed by validator %s.\n", ID(experiment), signer)
	fmt.Fprintf(&buf, "# experiment.roles, dataset.root and workload.device are this node's too. Any key can be overridden\n# by an environment variable named after its path (P2PNODE_NODE_LISTEN, P2PNODE_WORKLOAD_DEVICE).\n\n")
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, fmt.Errorf("write the local config: %w", err)
	}
	if err := enc.Close(); err != nil {
		return nil, fmt.Errorf("write the local config: %w", err)
	}
	return buf.Bytes(), nil
}

// section returns the mapping under key in m, adding an empty one when it is missing.
func section(m *yaml.Node, key string) *yaml.Node {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key && m.Content[i+1].Kind == yaml.MappingNode {
			return m.Content[i+1]
		}
	}
	v := &yaml.Node{Kind: yaml.MappingNode}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Value: key}, v)
	return v
}

// addKey sets key to value in mapping m (first when front), unless value is empty.
func addKey(m *yaml.Node, key string, value any, front bool) error {
	if reflect.ValueOf(value).IsZero() {
		return nil
	}
	var v yaml.Node
	if err := v.Encode(value); err != nil {
		return fmt.Errorf("write the local config: %s: %w", key, err)
	}
	if v.Kind == yaml.SequenceNode {
		v.Style = yaml.FlowStyle
	}
	kv := []*yaml.Node{{Kind: yaml.ScalarNode, Value: key}, &v}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content[i+1] = &v
			return nil
		}
	}
	if front {
		m.Content = append(kv, m.Content...)
	} else {
		m.Content = append(m.Content, kv...)
	}
	return nil
}

// Diff lists the keys whose values differ between two experiments' bytes, as
// "key: old → new", sorted.
func Diff(old, new []byte) []string {
	a, b := map[string]string{}, map[string]string{}
	flatten(old, a)
	flatten(new, b)
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	var out []string
	for k := range keys {
		va, oka := a[k]
		vb, okb := b[k]
		switch {
		case !oka:
			out = append(out, fmt.Sprintf("%s: (unset) → %s", k, vb))
		case !okb:
			out = append(out, fmt.Sprintf("%s: %s → (unset)", k, va))
		case va != vb:
			out = append(out, fmt.Sprintf("%s: %s → %s", k, va, vb))
		}
	}
	sort.Strings(out)
	return out
}

func flatten(b []byte, out map[string]string) {
	var v any
	if yaml.Unmarshal(b, &v) != nil {
		return
	}
	var walk func(prefix string, v any)
	walk = func(prefix string, v any) {
		if m, ok := v.(map[string]any); ok && len(m) > 0 {
			for k, x := range m {
				p := k
				if prefix != "" {
					p = prefix + "." + k
				}
				walk(p, x)
			}
			return
		}
		out[prefix] = fmt.Sprint(v)
	}
	walk("", v)
}
