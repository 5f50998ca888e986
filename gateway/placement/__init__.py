"""Placement: which engine, precision, GPUs and context each model gets, from the GPU inventory and the
model files' headers, with every decision explained (docs/hardware.md, "Placement").

    inventory = inventory_from_spec(config.gpus)   # "auto" (NVML), "none", or a layout like "2xv100-16gb"
    report = plan_models(config, inventory)        # never raises for a model that does not fit
    report.plans                                   # DeploymentPlans, in the order workers must start
    report.decision("m").prediction                # predicted tok/s of the chosen plan (performance.py)
    report.decision("m").choice                    # which rule chose it, and the runner-up (choice.py)
"""

from gateway.placement.estimate import MemoryEstimate
from gateway.placement.inspection import InspectionError, ModelShape, SourceInfo, inspect_source
from gateway.placement.inventory import GPU, Inventory, InventoryError, inventory_from_nvml, inventory_from_spec
from gateway.placement.performance import Prediction, gpu_spec
from gateway.placement.policy import plan_models
from gateway.placement.report import (
    Alternative,
    ChoiceReason,
    ModelDecision,
    PlacementReport,
    Rejection,
    render_plan_table,
)

__all__ = [
    "GPU",
    "Alternative",
    "ChoiceReason",
    "InspectionError",
    "Inventory",
    "InventoryError",
    "MemoryEstimate",
    "ModelDecision",
    "ModelShape",
    "PlacementReport",
    "Prediction",
    "Rejection",
    "SourceInfo",
    "gpu_spec",
    "inspect_source",
    "inventory_from_nvml",
    "inventory_from_spec",
    "plan_models",
    "render_plan_table",
]
