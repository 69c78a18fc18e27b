#!/usr/bin/env bash
# One device call: honest false rejections (fp32) on charlm and lm tiny with the final
# screening, and the same demos with the int8 and sparse codecs, side by side.
set -u
export PYTHONPATH=$(python3 -c 'import site;print(site.getsitepackages()[0])' 2>/dev/null)
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -c 'import torch;print("torch",torch.__version__,"cuda",torch.cuda.is_available())'
nproc
S=${S:-470}
mkdir -p $OUT/runs
scripts/false-rejections.sh -b bin/p2pnode -w charlm -r 400 -s $S -d $OUT/runs/fr-charlm > $OUT/fr-charlm.txt 2>&1 &
scripts/false-rejections.sh -b bin/p2pnode -w lm -p tiny -r 200 -s $S -d $OUT/runs/fr-lm > $OUT/fr-lm.txt 2>&1 &
for c in int8 sparse; do
  timeout --signal=INT --kill-after=20 $S bin/p2pnode demo --dir $OUT/runs/charlm-$c --workload charlm --rounds 400 --codec $c > $OUT/charlm-$c.out 2>&1 &
  timeout --signal=INT --kill-after=20 $S bin/p2pnode demo --dir $OUT/runs/lm-$c --workload lm --preset tiny --rounds 200 --codec $c > $OUT/lm-$c.out 2>&1 &
done
sleep 60; uptime; nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv,noheader
wait
uptime
# keep only small files: logs of the validators and history
find $OUT/runs -name '*.safetensors' -delete; find $OUT/runs -path '*artifacts*' -prune -exec rm -rf {} + 2>/dev/null
find $OUT/runs -type d -name scratch -prune -exec rm -rf {} + 2>/dev/null; find $OUT/runs -type d -name data -prune -exec rm -rf {} + 2>/dev/null
du -sh $OUT
for f in $OUT/fr-*.txt; do echo "== $f"; tail -25 $f; done
for f in $OUT/*.out; do echo "== $f"; tail -3 $f; done
