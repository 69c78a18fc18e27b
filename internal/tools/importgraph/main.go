// Command importgraph prints the shape of the module's import graph, from `go list -json
// ./...`: its packages and their lines, the import arrows between them, the arrows that
// run back up a layer, import circles between top-level directories, and the lines in
// node/.
//
//	go run ./internal/tools/importgraph            # this tree
//	go run ./internal/tools/importgraph -dir DIR   # another checkout of the module
//	go run ./internal/tools/importgraph -arrows    # every arrow, not only those back up
//
// Layers, top to bottom (DESIGN.md's "cmd → node → roles → the rest"; a package imports
// only its own layer or lower ones):
//
//	7 cmd     cmd/*, demo, e2e, docker/*: programs and their harnesses
//	6 node    node: composition
//	5 rooms   p2p, status, upkeep: the constructors node composes
//	4 roles   validator, trainer, headsync
//	3 round   round, bus, adversary
//	2 parts   lease, gossip, chain, artifact, dataset, checkpoint, export, pyruntime, synth, credit
//	1 pure    merge, diloco
//	0 leaves  pack, cids, codecs, detcbor, config, internal/*
//
// A package in none of these lists is placed in "parts" and named as unplaced.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
)

type layer struct {
	rank     int
	name     string
	prefixes []string // a package is in the layer if its path (relative to the module) is one or starts with one + "/"
}

var layers = []layer{
	{7, "cmd", []string{"cmd", "demo", "e2e", "docker"}},
	{6, "node", []string{"node"}},
	{5, "rooms", []string{"p2p", "status", "upkeep"}},
	{4, "roles", []string{"validator", "trainer", "headsync"}},
	{3, "round", []string{"round", "bus", "adversary"}},
	{2, "parts", []string{"lease", "gossip", "chain", "artifact", "dataset", "checkpoint", "export", "pyruntime", "synth", "credit", "invite", "doctor"}},
	{1, "pure", []string{"merge", "diloco"}},
	{0, "leaves", []string{"pack", "cids", "codecs", "detcbor", "config", "internal"}},
}

const partsRank = 2

// layerOf places a package (path relative to the module root); ok is false for an
// unplaced one.
func layerOf(rel string) (layer, bool) {
	for _, l := range layers {
		for _, p := range l.prefixes {
			if rel == p || strings.HasPrefix(rel, p+"/") {
				return l, true
			}
		}
	}
	for _, l := range layers {
		if l.rank == partsRank {
			return l, false
		}
	}
	panic("no parts layer")
}

type pkg struct {
	ImportPath   string
	Dir          string
	Module       *struct{ Path string }
	GoFiles      []string
	CgoFiles     []string
	TestGoFiles  []string
	XTestGoFiles []string
	Imports      []string
}

func main() {
	dir := flag.String("dir", ".", "root of the module checkout to read")
	all := flag.Bool("arrows", false, "print every arrow")
	flag.Parse()
	if err := run(os.Stdout, *dir, *all); err != nil {
		fmt.Fprintln(os.Stderr, "importgraph:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, dir string, all bool) error {
	pkgs, module, err := list(dir)
	if err != nil {
		return err
	}
	rel := func(p string) string {
		if p == module {
			return "."
		}
		return strings.TrimPrefix(p, module+"/")
	}
	ours := map[string]bool{}
	for _, p := range pkgs {
		ours[p.ImportPath] = true
	}
	type arrow struct{ from, to string }
	var arrows, back []arrow
	graph := map[string][]string{}
	var unplaced []string
	fmt.Fprintf(w, "%-28s %-7s %6s %6s  %s\n", "package", "layer", "lines", "tests", "imports (ours)")
	for _, p := range pkgs {
		from := rel(p.ImportPath)
		lf, ok := layerOf(from)
		if !ok {
			unplaced = append(unplaced, from)
		}
		var deps []string
		for _, imp := range p.Imports {
			if !ours[imp] {
				continue
			}
			to := rel(imp)
			deps = append(deps, to)
			arrows = append(arrows, arrow{from, to})
			graph[from] = append(graph[from], to)
			if lt, _ := layerOf(to); lt.rank > lf.rank {
				back = append(back, arrow{from, to})
			}
		}
		prod, err := lines(p.Dir, slices.Concat(p.GoFiles, p.CgoFiles))
		if err != nil {
			return err
		}
		tests, err := lines(p.Dir, slices.Concat(p.TestGoFiles, p.XTestGoFiles))
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "%-28s %-7s %6d %6d  %s\n", from, lf.name, prod, tests, strings.Join(deps, " "))
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "packages: %d\n", len(pkgs))
	fmt.Fprintf(w, "arrows: %d\n", len(arrows))
	if all {
		for _, a := range arrows {
			fmt.Fprintf(w, "  %s -> %s\n", a.from, a.to)
		}
	}
	fmt.Fprintf(w, "arrows back up a layer: %d\n", len(back))
	for _, a := range back {
		lf, _ := layerOf(a.from)
		lt, _ := layerOf(a.to)
		fmt.Fprintf(w, "  %s (%s) -> %s (%s)\n", a.from, lf.name, a.to, lt.name)
	}
	cycles := circles(graph, top)
	fmt.Fprintf(w, "circles between top-level directories: %d\n", len(cycles))
	for _, c := range cycles {
		fmt.Fprintf(w, "  %s\n", strings.Join(c, " <-> "))
	}
	for _, p := range pkgs {
		if rel(p.ImportPath) != "node" {
			continue
		}
		prod, _ := lines(p.Dir, slices.Concat(p.GoFiles, p.CgoFiles))
		tests, _ := lines(p.Dir, slices.Concat(p.TestGoFiles, p.XTestGoFiles))
		fmt.Fprintf(w, "node/: %d lines in %d files, tests %d lines in %d files\n",
			prod, len(p.GoFiles)+len(p.CgoFiles), tests, len(p.TestGoFiles)+len(p.XTestGoFiles))
	}
	if len(unplaced) > 0 {
		fmt.Fprintf(w, "unplaced (counted as %q): %s\n", layers[len(layers)-1-partsRank].name, strings.Join(unplaced, " "))
	}
	return nil
}

// top is a package's top-level directory: cmd/p2pnode and cmd/benchscale are one.
func top(rel string) string {
	before, _, _ := strings.Cut(rel, "/")
	return before
}

// circles are the strongly connected components of more than one node in the graph of
// top-level directories (group) that graph's arrows make; each sorted, the list sorted.
func circles(graph map[string][]string, group func(string) string) [][]string {
	g := map[string]map[string]bool{}
	for from, tos := range graph {
		gf := group(from)
		if g[gf] == nil {
			g[gf] = map[string]bool{}
		}
		for _, to := range tos {
			if gt := group(to); gt != gf {
				g[gf][gt] = true
			}
		}
	}
	// Tarjan's algorithm.
	index, low := map[string]int{}, map[string]int{}
	onStack := map[string]bool{}
	var stack []string
	var out [][]string
	next := 0
	var visit func(v string)
	visit = func(v string) {
		index[v], low[v] = next, next
		next++
		stack = append(stack, v)
		onStack[v] = true
		for u := range g[v] {
			if _, seen := index[u]; !seen {
				visit(u)
				low[v] = min(low[v], low[u])
			} else if onStack[u] {
				low[v] = min(low[v], index[u])
			}
		}
		if low[v] == index[v] {
			var comp []string
			for {
				u := stack[len(stack)-1]
				stack = stack[:len(stack)-1]
				onStack[u] = false
				comp = append(comp, u)
				if u == v {
					break
				}
			}
			if len(comp) > 1 {
				sort.Strings(comp)
				out = append(out, comp)
			}
		}
	}
	names := make([]string, 0, len(g))
	for v := range g {
		names = append(names, v)
	}
	sort.Strings(names)
	for _, v := range names {
		if _, seen := index[v]; !seen {
			visit(v)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i][0] < out[j][0] })
	return out
}

// list runs `go list -json ./...` in dir and returns the module's packages, sorted, and
// the module path.
func list(dir string) ([]pkg, string, error) {
	cmd := exec.Command("go", "list", "-json", "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, "", fmt.Errorf("go list in %s: %w: %s", dir, err, stderr.String())
	}
	var pkgs []pkg
	module := ""
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			return nil, "", fmt.Errorf("go list output: %w", err)
		}
		if p.Module != nil && module == "" {
			module = p.Module.Path
		}
		pkgs = append(pkgs, p)
	}
	if module == "" {
		return nil, "", fmt.Errorf("go list in %s: no module", dir)
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].ImportPath < pkgs[j].ImportPath })
	return pkgs, module, nil
}

// lines counts the lines of the named files in dir.
func lines(dir string, files []string) (int, error) {
	n := 0
	for _, f := range files {
		fh, err := os.Open(filepath.Join(dir, f))
		if err != nil {
			return 0, err
		}
		sc := bufio.NewScanner(fh)
		sc.Buffer(make([]byte, 64<<10), 4<<20)
		for sc.Scan() {
			n++
		}
		err = sc.Err()
		fh.Close()
		if err != nil {
			return 0, fmt.Errorf("%s: %w", f, err)
		}
	}
	return n, nil
}
