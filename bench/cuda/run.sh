# The CUDA plan-vs-measured run (bench/README.md, "On CUDA"), on a GPU box with no network.
# Needs: torch + transformers + peft there; bitsandbytes, pydantic and jsonschema wheels in .whl/;
# the SmolLM2 tokenizer files (tokenizer.json, tokenizer_config.json, chat_template.jinja,
# generation_config.json) in $TOKENIZER_DIR (default .gpu/tok); results go to $OUT.
OUT=${OUT:-$PWD/.gpu-out}; mkdir -p $OUT

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=$PWD/.gpu-data
mkdir -p $D && cp bench/noise_reward.py $D/
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers, peft, bitsandbytes; print(torch.__version__, transformers.__version__, peft.__version__, bitsandbytes.__version__)" || exit 1
if [ ! -f $D/models/llama8b-shape/manifest.json ]; then
  python3 bench/cuda/make_model.py appliance/budget/fixtures/${SHAPE:-Llama-3.1-8B}.json /tmp/m/shape || exit 1
  python3 -m appliance models import /tmp/m/shape --name llama8b-shape --data-dir $D || exit 1
  rm -rf /tmp/m
fi
for R in ${ROLLOUTS:-shared merged_copy}; do
  rm -rf $D/jobs/gpu-$R
  sed "s/ROLLOUT/$R/; s/name: gpu-llama8b/name: gpu-$R/" bench/cuda/job.yaml > $D/job-$R.yaml
  python3 -m appliance plan $D/job-$R.yaml --data-dir $D --json > $OUT/plan-$R.json; echo plan rc $?
  python3 -m appliance plan $D/job-$R.yaml --data-dir $D | head -40
  (while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.3; done) > /tmp/smi-$R.txt &
  SMI=$!
  python3 -m appliance train $D/job-$R.yaml --data-dir $D 2>&1 | tail -25
  kill $SMI
  echo "nvidia-smi peak MiB ($R): $(sort -n /tmp/smi-$R.txt | tail -1)"
  cp $D/jobs/gpu-$R/metrics.jsonl $OUT/metrics-$R.jsonl; cp $D/jobs/gpu-$R/log.txt $OUT/log-$R.txt
  sort -n /tmp/smi-$R.txt | tail -1 > $OUT/smi-peak-$R.txt
done
