package config

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
	"gopkg.in/yaml.v3"
)

func TestTemplateSpellsOutTheDefaults(t *testing.T) {
	got, err := Parse(Template)
	require.NoError(t, err)
	require.Equal(t, Default(), got, "config/template.yaml and Default() disagree")
	require.NoError(t, got.Validate())
}

// A file with no settings is refused (a truncated config must not start the default
// experiment); `{}` says "every default" on purpose.
func TestEmptyFileIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		empty      bool
	}{
		{"no bytes", "", true},
		{"blank lines", "\n\n", true},
		{"comments only", "# experiment:\n#   rounds: 5\n", true},
		{"a document marker only", "---\n", true},
		{"null", "~\n", true},
		{"an empty mapping", "{}\n", false},
		{"one setting", "experiment:\n  rounds: 5\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse([]byte(tc.yaml))
			if !tc.empty {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrEmpty)
			require.ErrorIs(t, err, ErrInvalid)
			require.Nil(t, got)
		})
	}
	got, err := Parse([]byte("{}"))
	require.NoError(t, err)
	require.Equal(t, Default(), got)

	p := filepath.Join(t.TempDir(), "p2pnode.yaml")
	require.NoError(t, os.WriteFile(p, nil, 0o600))
	_, err = Load(p)
	require.ErrorIs(t, err, ErrEmpty)
	require.Contains(t, err.Error(), p, "the error names the file")
}

// A fraction in an integer setting is refused naming the setting, not truncated; whole
// numbers written as floats, and fractions in float settings and durations, are fine.
func TestFractionForIntegerSettingIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name, yaml, want string // want: "" when the file is accepted
	}{
		{"rounds", "experiment:\n  rounds: 2.9\n", "experiment.rounds: 2.9 is not a whole number (line 2)"},
		{"threads", "workload:\n  threads: 1.5\n", "workload.threads: 1.5 is not a whole number (line 2)"},
		{"int64 seed", "experiment:\n  seed: 0.5\n", "experiment.seed: 0.5 is not a whole number"},
		{"negative", "lease:\n  min_group: -1.5\n", "lease.min_group: -1.5 is not a whole number"},
		{"exponent", "experiment:\n  rounds: 2.5e0\n", "experiment.rounds: 2.5e0 is not a whole number"},
		{"infinity", "experiment:\n  rounds: .inf\n", "experiment.rounds: .inf is not a whole number"},
		{"two at once", "experiment:\n  rounds: 2.9\nworkload:\n  threads: 1.5\n", "workload.threads: 1.5"},
		{"whole as float", "experiment:\n  rounds: 3.0\n", ""},
		{"whole with exponent", "experiment:\n  rounds: 1e2\n", ""},
		{"float setting", "protocol:\n  diloco:\n    outer_lr: 0.5\n", ""},
		{"duration", "lease:\n  round_timeout: 1.5s\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tc.yaml))
			if tc.want == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalid)
			require.ErrorContains(t, err, tc.want)
			require.Nil(t, cfg)
		})
	}
	cfg, err := Parse([]byte("experiment:\n  rounds: 3.0\n"))
	require.NoError(t, err)
	require.Equal(t, 3, cfg.Experiment.Rounds)
}

// protocol.diloco.outer_lr left out, or 0, is the codec's default; a number is kept.
func TestOuterLRDefaultsByCodec(t *testing.T) {
	for _, tc := range []struct {
		name, yaml string
		want       float64
	}{
		{"fp32, left out", "protocol:\n  codec: fp32", DefaultOuterLR},
		{"sparse, left out", "protocol:\n  codec: sparse", SparseOuterLR},
		{"sparse with overlap, left out", "protocol:\n  codec: sparse\n  overlap: eager", SparseOuterLR},
		{"sparse, diloco without outer_lr", "protocol:\n  codec: sparse\n  diloco:\n    momentum: 0.5", SparseOuterLR},
		{"sparse, 0", "protocol:\n  codec: sparse\n  diloco: {outer_lr: 0}", SparseOuterLR},
		{"int8, 0", "protocol:\n  codec: int8\n  diloco:\n    outer_lr: 0", DefaultOuterLR},
		{"sparse, set", "protocol:\n  codec: sparse\n  diloco:\n    outer_lr: 1.0", 1.0},
		{"fp32, set", "protocol:\n  diloco:\n    outer_lr: 0.7", 0.7},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tc.yaml))
			require.NoError(t, err)
			require.Equal(t, tc.want, cfg.Protocol.DiLoCo.OuterLR)
			require.NoError(t, cfg.Validate())
		})
	}
}

func TestShippedConfigsLoad(t *testing.T) {
	files, err := filepath.Glob("../configs/*.yaml")
	require.NoError(t, err)
	require.NotEmpty(t, files, "configs/ holds no example configs")
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			cfg, err := Load(f)
			require.NoError(t, err)
			require.True(t, filepath.IsAbs(cfg.Node.StoreDir))
		})
	}
}

func TestErrorsNameTheField(t *testing.T) {
	cases := []struct {
		name, yaml string
		want       []string
	}{
		{"unknown top-level", "nodes: {}", []string{"nodes: unknown field (line 1)", `did you mean "node"`}},
		{"unknown nested", "workload:\n  facotry: x:y", []string{"workload.facotry: unknown field (line 2)", `did you mean "factory"`}},
		{"renamed field", "protocol:\n  ema:\n    decay: 0.9", []string{"protocol.ema.decay (line 3): renamed to protocol.ema.new_weight", "write new_weight with the number you had"}},
		{"wrong type", "protocol:\n  inner_steps: many", []string{"protocol.inner_steps", "line 2"}},
		{"outer lr", "protocol:\n  diloco:\n    outer_lr: -1", []string{"protocol.diloco.outer_lr: must be > 0"}},
		{"momentum", "protocol:\n  diloco:\n    momentum: 1.5", []string{"protocol.diloco.momentum: must be in [0, 1)"}},
		{"codec", "protocol:\n  codec: int4", []string{`protocol.codec: must be fp32, fp16, int8 or sparse, got "int4"`}},
		{"sparse momentum", "protocol:\n  codec: sparse\n  diloco:\n    momentum: 0.9", []string{"protocol.diloco.momentum: must be <= 0.5 with protocol.codec sparse"}},
		{"sparse block", "protocol:\n  codec: sparse\n  sparse_block: 0", []string{"protocol.sparse_block: must be in [1, 16777216], got 0"}},
		{"sparse top-k", "protocol:\n  codec: sparse\n  sparse_block: 128\n  sparse_topk: 129", []string{"protocol.sparse_topk: must be in [1, protocol.sparse_block = 128], got 129"}},
		{"feedback decay", "protocol:\n  codec: sparse\n  sparse_feedback_decay: 0", []string{"protocol.sparse_feedback_decay: must be in (0, 1] (1 = plain error feedback), got 0"}},
		{"warm-up rounds", "protocol:\n  codec: sparse\n  sparse_warmup_rounds: -1", []string{"protocol.sparse_warmup_rounds: must be in [0, 1000] (0 = no top-k warm-up), got -1"}},
		{"warm-up factor", "protocol:\n  codec: sparse\n  sparse_warmup_factor: 0.5", []string{"protocol.sparse_warmup_factor: must be in [1, 1024] (1 = no top-k warm-up), got 0.5"}},
		{"feedback decay above 1", "protocol:\n  sparse_feedback_decay: 1.2", []string{"protocol.sparse_feedback_decay: must be in (0, 1]"}},
		{"overlap", "protocol:\n  overlap: streaming", []string{`protocol.overlap: must be empty (no overlap) or "eager", got "streaming"`}},
		{"policy", "protocol:\n  merge_policy: sgd", []string{`protocol.merge_policy: must be "diloco" or "ema"`}},
		{"factory", "workload:\n  factory: nocolon", []string{`workload.factory: must be "module:attr"`}},
		{"backend", "workload:\n  backend: docker", []string{"workload.backend"}},
		{"command program", "workload:\n  backend: checkpoint_command", []string{"workload.command.program: must be set"}},
		{"role", "experiment:\n  roles: [trainer, miner]", []string{`experiment.roles[1]: unknown role "miner"`}},
		{"quorum", "experiment:\n  validators: [12D3KooWJndsDidjsE4N4W9MaRtLQ8iPPLXypd7k2W1Pb4qTP46D]\n  quorum: 2", []string{"experiment.quorum: 2 exceeds the 1 configured validators"}},
		{"validator id", "experiment:\n  validators: [not-a-peer]", []string{`experiment.validators[0]: "not-a-peer" is not a peer id`}},
		{"listen", "node:\n  listen: [not-an-addr]", []string{"node.listen[0]"}},
		{"keep heads", "node:\n  keep_heads: 1", []string{"node.keep_heads: must be at least 2", "node.archive: true", "got 1"}},
		{"relay duration", "node:\n  relay_limit:\n    duration: -1m", []string{"node.relay_limit.duration: must be between 1s and 24h, got -1m0s"}},
		{"relay data", "node:\n  relay_limit:\n    data_mib: 0", []string{"node.relay_limit.data_mib: must be between 1 and 65536, got 0"}},
		{"reachability", "node:\n  reachability: behind-nat", []string{"node.reachability: must be auto, public or private, got \"behind-nat\""}},
		{"stream deadline", "node:\n  stream_deadline: 0s", []string{"node.stream_deadline: must be between 100ms and 10m, got 0s"}},
		{"bootstrap needs peer id", "node:\n  bootstrap: [/ip4/127.0.0.1/tcp/4001]", []string{"node.bootstrap[0]", "/p2p/<peer id>"}},
		{"list element unknown", "merge:\n  screen:\n    max_norm_ration: 3", []string{"merge.screen.max_norm_ration: unknown field", `did you mean "max_norm_ratio"`}},
		{"several at once", "protocol:\n  inner_steps: 0\nlease:\n  min_group: 0", []string{"protocol.inner_steps: must be >= 1", "lease.min_group: must be >= 1"}},
		{"samples per step", "lease:\n  samples_per_step: -1", []string{"lease.samples_per_step: must be >= 0 (0 = workload.config.batch_size), got -1"}},
		{"export dir", "export:\n  every_rounds: 5", []string{"export.dir: must be set"}},
		{"not yaml", "node: [unclosed", []string{"invalid config"}},
		{"quorum not a majority", "experiment:\n  validators: [12D3KooWJndsDidjsE4N4W9MaRtLQ8iPPLXypd7k2W1Pb4qTP46D, 12D3KooWKRkDv7Qtc3XarfLsiD2Cr8Hfx2Ly5DgCaR7HQMht5Epi]\n  quorum: 1", []string{"experiment.quorum: 1 of 2 validators is not a majority", "use at least 2"}},
		{"quorum without validators", "experiment:\n  quorum: 3", []string{"experiment.quorum: 3 needs experiment.validators to list at least 3 peer ids"}},
		{"trainer without validators", "experiment:\n  roles: [trainer]", []string{"experiment.validators: a trainer without the validator role needs the validators' peer ids"}},
		{"psk length", "node:\n  psk: abc", []string{"node.psk: must be 64 hex characters", "got 3 characters"}},
		{"psk not hex", "node:\n  psk: " + strings.Repeat("zz", 32), []string{"node.psk: must be 64 hex characters"}},
		{"psk needs tcp", "node:\n  psk: " + strings.Repeat("ab", 32) + "\n  listen: [/ip4/0.0.0.0/udp/0/quic-v1]", []string{"node.psk: a private network runs over TCP only"}},
		{"device", "workload:\n  device: gpu0", []string{`workload.device: "gpu0" is not auto, cpu, cuda, cuda:N or mps`}},
		{"device index", "workload:\n  device: cuda:x", []string{`workload.device: "cuda:x"`}},
		{"precision", "workload:\n  precision: fp8", []string{`workload.precision: must be fp32, bf16 or fp16, got "fp8"`}},
		{"fp16 on cpu", "workload:\n  device: cpu\n  precision: fp16", []string{"workload.precision: fp16 needs a CUDA device"}},
		{"a GPU twice", "workload:\n  devices: [cuda:0, cuda:1, cuda:0]", []string{`workload.devices[2]: "cuda:0" names the same GPU as workload.devices[0]`}},
		{"a GPU without index", "workload:\n  devices: [cuda:0, cuda]", []string{`workload.devices[1]: "cuda": name each GPU by its index`}},
		{"not a GPU", "workload:\n  devices: [gpu0, cuda:1]", []string{`workload.devices[0]: "gpu0" is not a GPU`}},
		{"cpu and cuda", "workload:\n  devices: [cpu, cuda:0]", []string{"workload.devices: mixes cpu and cuda"}},
		{"cpu devices", "workload:\n  devices: [cpu, cpu]", []string{"workload.devices: lists cpu: set workload.device: cpu and workload.ranks"}},
		{"all in a list", "workload:\n  devices: [all, cuda:0]", []string{"workload.devices[0]: all stands alone"}},
		{"devices and device", "workload:\n  device: cuda:0\n  devices: [cuda:0, cuda:1]", []string{`workload.devices: and workload.device ("cuda:0") are both set`}},
		{"devices and ranks", "workload:\n  devices: all\n  ranks: 2", []string{"workload.ranks: and workload.devices are both set"}},
		{"ranks on a gpu", "workload:\n  device: cuda:0\n  ranks: 2", []string{`workload.ranks: 2 runs ranks on the CPU, and workload.device is "cuda:0"`}},
		{"negative ranks", "workload:\n  ranks: -1", []string{"workload.ranks: must be >= 0, got -1"}},
		{"fsdp on one rank", "workload:\n  device: cpu\n  shard: fsdp", []string{"workload.shard: fsdp needs at least two ranks"}},
		{"fsdp on one gpu", "workload:\n  devices: [cuda:1]\n  shard: fsdp", []string{"workload.shard: fsdp needs at least two ranks"}},
		{"shard", "workload:\n  shard: zero3", []string{`workload.shard: must be ddp or fsdp, got "zero3"`}},
		{"rank timeout", "workload:\n  rank_timeout: 0s", []string{"workload.rank_timeout: must be > 0"}},
		{"ranks need the worker", "workload:\n  backend: checkpoint_command\n  command:\n    program: train.sh\n  devices: all", []string{"workload.devices: needs the worker backend"}},
		{"checkpointing needs the worker", "workload:\n  backend: checkpoint_command\n  command:\n    program: train.sh\n  activation_checkpointing: true", []string{"workload.activation_checkpointing: needs the worker backend"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := Parse([]byte(tc.yaml))
			if err == nil {
				err = cfg.Validate()
			}
			require.Error(t, err)
			require.ErrorIs(t, err, ErrInvalid)
			for _, w := range tc.want {
				require.Contains(t, err.Error(), w)
			}
		})
	}
}

// workload.devices is a list or one word, and survives a write and a read (the e2e harness
// writes configs back to YAML).
func TestDevicesListOrAll(t *testing.T) {
	for _, tc := range []struct {
		yaml string
		want Devices
	}{
		{"workload:\n  devices: all", Devices{DevicesAll}},
		{"workload:\n  devices: [cuda:0, cuda:1]", Devices{"cuda:0", "cuda:1"}},
		{"workload:\n  devices: []", nil},
		{"workload:\n  ranks: 2\n  device: cpu", nil},
	} {
		cfg, err := Parse([]byte(tc.yaml))
		require.NoError(t, err, tc.yaml)
		require.NoError(t, cfg.Validate(), tc.yaml)
		require.Equal(t, tc.want, cfg.Workload.Devices, tc.yaml)
		b, err := yaml.Marshal(cfg)
		require.NoError(t, err)
		again, err := Parse(b)
		require.NoError(t, err)
		require.Equal(t, cfg.Workload, again.Workload, "%s round trip:\n%s", tc.yaml, b)
	}
}

func TestLoadResolvesRelativePaths(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "exp.yaml")
	require.NoError(t, os.WriteFile(path, []byte("node:\n  store_dir: state\ndataset:\n  root: data\n"), 0o644))
	cfg, err := Load(path)
	require.NoError(t, err)
	require.Equal(t, filepath.Join(dir, "state"), cfg.Node.StoreDir)
	require.Equal(t, filepath.Join(dir, "data"), cfg.Dataset.Root)
	require.Equal(t, filepath.Join(dir, "data", "manifest.json"), cfg.Dataset.Manifest)
}

func TestLoadReportsTheFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "bad.yaml")
	require.NoError(t, os.WriteFile(path, []byte("protocol:\n  inner_steps: -1\n"), 0o644))
	_, err := Load(path)
	require.Error(t, err)
	require.True(t, strings.HasPrefix(err.Error(), "config "+path), err.Error())
	_, err = Load(filepath.Join(dir, "missing.yaml"))
	require.Error(t, err)
}

func TestEveryFieldHasATemplateEntry(t *testing.T) {
	// Each yaml key of Config must appear in the template, so `p2pnode init` documents it.
	var walk func(reflect.Type, string)
	walk = func(t2 reflect.Type, prefix string) {
		for name, f := range yamlFields(t2) {
			if !strings.Contains(string(Template), name+":") {
				t.Errorf("template.yaml does not mention %s%s", prefix, name)
			}
			if f.Type.Kind() == reflect.Struct && f.Type.Name() != "Duration" {
				walk(f.Type, prefix+name+".")
			}
		}
	}
	walk(reflect.TypeOf(Config{}), "")
}

func FuzzParse(f *testing.F) {
	f.Add(Template)
	f.Add([]byte("node: {store_dir: x}\nexperiment: {roles: [trainer]}"))
	f.Fuzz(func(t *testing.T, b []byte) {
		cfg, err := Parse(b)
		if err == nil {
			_ = cfg.Validate()
		}
	})
}
