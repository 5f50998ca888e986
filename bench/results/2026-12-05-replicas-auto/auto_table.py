"""replicas: auto on simulated V100 layouts (the unit tests' zoo: a Llama-2-7B shape, HF FP16 headers)."""
import tempfile
from pathlib import Path

from gateway.config import Config
from gateway.placement import inventory_from_spec
from gateway.placement.replica_choice import plan_with_replicas
from tests.unit.placement_models import build_zoo

zoo = build_zoo(Path(tempfile.mkdtemp()))
for gpus, c in (("8xv100-32gb", 64), ("8xv100-32gb", 32), ("4xv100-16gb-pcie", 16), ("2xv100-16gb", 8)):
    model = {"name": "m", "sources": [{"hf": "llama2-7b"}], "context": 2048, "concurrency": c, "engine": "lmdeploy",
             "replicas": "auto"}
    _, report = plan_with_replicas(Config.model_validate({"gpus": gpus, "models": [model], "base_dir": zoo}),
                                   inventory_from_spec(gpus))
    print(f"{gpus}, {c} sessions: {report.decision('m').notes[0]}")
    print("  plans: " + ", ".join(f"{p.model} GPUs {list(p.gpu_indices)} tp {p.tp}" for p in report.plans))
    _, one = plan_with_replicas(Config.model_validate({"gpus": gpus, "models": [{**model, "replicas": 1}],
                                                       "base_dir": zoo}), inventory_from_spec(gpus))
    print("  one placement (replicas: 1): " + ", ".join(f"GPUs {list(p.gpu_indices)} tp {p.tp}" for p in one.plans))
