package demo

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestWriteConfigsPerWorkload(t *testing.T) {
	for _, tc := range []struct {
		workload, preset, factory, experiment string
		microshardBytes                       int64
	}{
		{"", "", "", "digits-demo", 16384},
		{WorkloadLM, "", "p2ptrain.workloads.lm:LM", "lm-tiny-demo", 65536},
		{WorkloadCharLM, "", "p2ptrain.workloads.charlm:CharLM", "charlm-demo", 65536},
	} {
		t.Run(tc.experiment, func(t *testing.T) {
			cfgs, err := WriteConfigs(Options{Dir: t.TempDir(), Trainers: 2, Rounds: 3, Workload: tc.workload, Preset: tc.preset})
			require.NoError(t, err)
			require.Len(t, cfgs, 3)
			for _, c := range cfgs {
				require.Equal(t, tc.experiment, c.Experiment.ID)
				require.Equal(t, 3, c.Experiment.Rounds)
				require.EqualValues(t, tc.microshardBytes, c.Dataset.MicroshardBytes)
				if tc.factory != "" {
					require.Equal(t, tc.factory, c.Workload.Factory)
				}
			}
		})
	}
}

func TestWorkloadChoicesAreChecked(t *testing.T) {
	for _, tc := range []struct {
		workload, preset, wantErr string
	}{
		{"resnet", "", `--workload "resnet": unknown workload`},
		{WorkloadCharLM, "tiny", `--preset "tiny": only the lm workload has presets`},
		{WorkloadDigits, "tiny", `--preset "tiny": only the lm workload has presets`},
	} {
		err := Options{Workload: tc.workload, Preset: tc.preset}.checkWorkload()
		require.ErrorContains(t, err, tc.wantErr)
	}
	require.NoError(t, Options{Workload: WorkloadLM, Preset: "small"}.checkWorkload())
}

func TestCodecReachesEveryNode(t *testing.T) {
	for _, codec := range []string{"", "int8", "sparse"} {
		cfgs, err := WriteConfigs(Options{Dir: t.TempDir(), Trainers: 2, Rounds: 3, Codec: codec})
		require.NoError(t, err)
		want := codec
		if want == "" {
			want = "fp32"
		}
		for _, c := range cfgs {
			require.Equal(t, want, c.Protocol.Codec)
		}
	}
	_, err := WriteConfigs(Options{Dir: t.TempDir(), Trainers: 1, Rounds: 3, Codec: "int4"})
	require.ErrorContains(t, err, `protocol.codec: must be fp32, fp16, int8 or sparse, got "int4"`)
}

func TestOverlapReachesEveryNode(t *testing.T) {
	cfgs, err := WriteConfigs(Options{Dir: t.TempDir(), Trainers: 2, Rounds: 3, Codec: "sparse", Overlap: "eager"})
	require.NoError(t, err)
	for _, c := range cfgs {
		require.Equal(t, "eager", c.Protocol.Overlap)
	}
	_, err = WriteConfigs(Options{Dir: t.TempDir(), Trainers: 1, Rounds: 3, Overlap: "lazy"})
	require.ErrorContains(t, err, `protocol.overlap: must be empty (no overlap) or "eager", got "lazy"`)
}
