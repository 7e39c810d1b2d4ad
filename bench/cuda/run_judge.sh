# The CUDA plan-vs-measured run (bench/README.md, "On CUDA"), on a GPU box with no network.
# Needs: torch + transformers + peft there; bitsandbytes, pydantic and jsonschema wheels in .whl/;
# the SmolLM2 tokenizer files (tokenizer.json, tokenizer_config.json, chat_template.jinja,
# generation_config.json) in $TOKENIZER_DIR (default .gpu/tok); results go to $OUT.
OUT=${OUT:-$PWD/.gpu-out}; mkdir -p $OUT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
D=$PWD/.gpu-data
mkdir -p $D && cp bench/noise_reward.py $D/
if [ ! -f $D/models/llama8b-shape/manifest.json ]; then
  python3 bench/cuda/make_model.py appliance/budget/fixtures/Llama-3.1-8B.json /tmp/m/shape 2>&1 | tail -1 || exit 1
  python3 -m appliance models import /tmp/m/shape --name llama8b-shape --data-dir $D || exit 1
  rm -rf /tmp/m
fi
for B in ${BUDGETS:-90% 40GiB}; do
  N=$(echo $B | tr -d '%'); rm -rf $D/jobs/gpu-judge-$N
  sed "s/BUDGETNAME/$N/; s/BUDGET/$B/" bench/cuda/judge.yaml > $D/judge-$N.yaml
  python3 -m appliance plan $D/judge-$N.yaml --data-dir $D --json > $OUT/plan-judge-$N.json; echo plan rc $?
  python3 -m appliance plan $D/judge-$N.yaml --data-dir $D | head -40
  (while true; do nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits; sleep 0.3; done) > /tmp/smi-$N.txt &
  SMI=$!
  timeout 240 python3 -m appliance train $D/judge-$N.yaml --data-dir $D 2>&1 | grep -v "^Loading" | tail -20
  kill $SMI
  echo "nvidia-smi peak MiB ($B): $(sort -n /tmp/smi-$N.txt | tail -1)"
  cp $D/jobs/gpu-judge-$N/metrics.jsonl $OUT/metrics-judge-$N.jsonl; cp $D/jobs/gpu-judge-$N/judge.jsonl $OUT/judge-$N.jsonl 2>/dev/null
  head -c 3000000 $D/jobs/gpu-judge-$N/log.txt > $OUT/log-judge-$N.txt
done
