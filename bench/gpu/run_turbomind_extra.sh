#!/usr/bin/env bash
# ON A FRESH GPU MACHINE, repo root, .gpu/ carried: what run_turbomind.sh did not check live.
#   bash bench/gpu/run_turbomind_extra.sh RESULTS_DIR
# TurboMind FP16 through voltgate on a "V100-32GB" (H200 held to 32,510 MiB free): an over-long prompt must come
# back as 400 context_length_exceeded, JSON mode must give JSON (guided decoding), and the sweep goes to 48/64 streams.
set -uo pipefail
R=${1:?results dir}; mkdir -p "$R"
export G=/tmp/gpu
exec > >(tee -a "$R/run_turbomind_extra.log") 2>&1
stamp() { echo "== [$(date +%T) +${SECONDS}s] $*"; }
stamp start
bash .gpu/setup_device.sh .gpu/pack lmdeploy > "$R/setup_lmdeploy.log" 2>&1 || { tail -20 "$R/setup_lmdeploy.log"; exit 1; }
source "$G/env.sh"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site2 .gpu/extra/*.whl > /dev/null 2>&1
export PYTHONPATH=$PWD:/tmp/site2:$PYTHONPATH PYTHONUNBUFFERED=1
mkdir -p /tmp/bin && printf '#!/bin/sh\nexec python3 -m lmdeploy "$@"\n' > /tmp/bin/lmdeploy && chmod +x /tmp/bin/lmdeploy
export PATH=/tmp/bin:$PATH
python3 .gpu/make_model.py $G/models/7b --shape 7b > "$R/make_model.log" 2>&1; stamp "model made"
python3 .gpu/hold_memory.py --leave-free-mib 32510 --device 0 > "$R/hold0.log" 2>&1 & H0=$!
sleep 6
python3 -m gateway serve --config bench/gpu/configs/tm-7b.yaml --gpus v100-32gb > "$R/gateway.log" 2>&1 & GW=$!
for _ in $(seq 1 300); do curl -sf http://127.0.0.1:8000/ready > /dev/null && break; kill -0 $GW || break; sleep 1; done
stamp "ready"
python3 - << 'PY' | tee "$R/checks.jsonl"
import json, httpx
u = "http://127.0.0.1:8000/v1/chat/completions"
long = {"model": "llama2-7b", "messages": [{"role": "user", "content": "word " * 3000}], "max_tokens": 8}
for stream in (False, True):
    r = httpx.post(u, json={**long, "stream": stream}, timeout=60)
    print(json.dumps({"check": f"over_long_prompt stream={stream}", "status": r.status_code, "body": r.text[:400]}))
js = {"model": "llama2-7b", "messages": [{"role": "user", "content": "a JSON object please"}], "max_tokens": 64,
      "response_format": {"type": "json_object"}}
r = httpx.post(u, json=js, timeout=120)
entry = {"check": "json_mode", "status": r.status_code, "body": r.text[:600]}
try:
    content = r.json()["choices"][0]["message"]["content"]; entry["finish"] = r.json()["choices"][0]["finish_reason"]
    json.loads(content); entry["valid_json"] = True
except Exception as exc:
    entry["valid_json"] = False; entry["error"] = repr(exc)[:200]
print(json.dumps(entry))
PY
python3 -m bench.loadgen --base-url http://127.0.0.1:8000/v1 --model llama2-7b --endpoint completions \
  --prompt-tokens 128 --output-tokens 256 --concurrency 48 64 --label turbomind-fp16-v100-32gb-high \
  --notes "H200 with memory held to v100-32gb; random-weight Llama-2-7B shape; through voltgate (max batch 29 by plan)" \
  --output "$R/loadgen_high.json" 2>&1 | tail -4
kill -TERM $GW; wait $GW; kill $H0; wait $H0 2> /dev/null
stamp end
