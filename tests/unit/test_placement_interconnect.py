"""The interconnect of a tensor-parallel set (gateway/placement/interconnect.py): how NVML's topology and a
simulated layout's suffix become NVLink or PCIe, what an all-reduce then costs, and the plan saying so."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from gateway.placement import GPU, render_plan_table
from gateway.placement.interconnect import (
    NVLINK_LATENCY_S,
    PCIE_HOST_BUS_BYTES_S,
    PCIE_SWITCH_BUS_BYTES_S,
    interconnect_of,
    link_for,
)
from tests.unit.placement_models import build_zoo
from tests.unit.test_placement_choice import decide, report_for
from tests.unit.test_placement_policy import hf


@pytest.fixture(scope="module")
def zoo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_zoo(tmp_path_factory.mktemp("zoo"))


def gpu(index: int, nvlink: tuple[int, ...] = (), switch: tuple[int, ...] = ()) -> GPU:
    return GPU(index=index, name="Tesla V100-SXM2-32GB", total_bytes=1, free_bytes=1, compute_capability=(7, 0),
               nvlink_peers=nvlink, switch_peers=switch)  # fmt: skip


# --- which interconnect a GPU set has ------------------------------------------------------------------------

# A DGX-1's hybrid cube-mesh, quad 0-3: 0-1, 0-2, 0-3, 1-2, 1-3, 2-3 linked; quad 4-7 likewise; 0-4, 1-5, 2-6, 3-7.
DGX1 = {0: (1, 2, 3, 4), 1: (0, 2, 3, 5), 2: (0, 1, 3, 6), 3: (0, 1, 2, 7),
        4: (5, 6, 7, 0), 5: (4, 6, 7, 1), 6: (4, 5, 7, 2), 7: (4, 5, 6, 3)}  # fmt: skip


@pytest.mark.parametrize(
    ("indices", "kind"),
    [
        ((0, 1), "nvlink"),
        ((0, 1, 2, 3), "nvlink"),
        (tuple(range(8)), "nvlink"),  # not every pair is linked, but the links join all eight: NCCL rings over them
        ((0, 5), "pcie-host"),  # no NVLink between these two
    ],
)
def test_a_set_is_nvlink_when_its_links_join_it(indices: tuple[int, ...], kind: str) -> None:
    gpus = [gpu(i, nvlink=DGX1[i]) for i in indices]
    assert interconnect_of(gpus) == kind


def test_pcie_through_a_switch_needs_every_pair_below_one() -> None:
    assert interconnect_of([gpu(0, switch=(1,)), gpu(1, switch=(0,))]) == "pcie-switch"
    three = [gpu(0, switch=(1,)), gpu(1, switch=(0,)), gpu(2)]  # GPU 2 hangs off the other CPU
    assert interconnect_of(three) == "pcie-host"


# --- what an all-reduce costs ------------------------------------------------------------------------------------


def test_an_allreduce_costs_latency_per_extra_gpu_plus_the_ring_bytes_over_the_bus() -> None:
    pcie = link_for("pcie-host", (7, 0))
    message = 5120 * 16 * 2  # a 13B's hidden state for 16 tokens, FP16
    assert pcie.allreduce_s(1, message) == 0
    assert pcie.allreduce_s(2, message) == pytest.approx(pcie.latency_s + message / PCIE_HOST_BUS_BYTES_S)
    assert pcie.allreduce_s(4, message) == pytest.approx(3 * pcie.latency_s + 1.5 * message / PCIE_HOST_BUS_BYTES_S)
    nvlink = link_for("nvlink", (7, 0))
    assert nvlink.latency_s == NVLINK_LATENCY_S < pcie.latency_s
    assert nvlink.allreduce_s(2, message) < link_for("pcie-switch", (7, 0)).allreduce_s(2, message)
    assert PCIE_HOST_BUS_BYTES_S < PCIE_SWITCH_BUS_BYTES_S < nvlink.bus_bytes_s < link_for("nvlink", (9, 0)).bus_bytes_s


# --- the plan: same model, same GPU row, NVLink against PCIe -----------------------------------------------------


@pytest.mark.parametrize(
    ("model", "count", "concurrency"),
    [("llama2-13b", 2, 8), ("llama2-70b", 8, 8)],
)
def test_the_same_tp_plan_decodes_and_prefills_slower_over_pcie(
    zoo: Path, model: str, count: int, concurrency: int
) -> None:
    """`v100:32:7.0` matches the same V100 row either way, so only the interconnect differs."""
    decisions = {
        link: decide(zoo, f"{count}xv100:32:7.0:{link}", sources=[hf(model)], concurrency=concurrency)
        for link in ("nvlink", "pcie-switch", "pcie")
    }
    plans = {link: d.plan for link, d in decisions.items()}
    assert all(p is not None and p.tp == count for p in plans.values())
    speed = {link: d.prediction for link, d in decisions.items()}
    assert all(p is not None for p in speed.values())
    nv, sw, host = speed["nvlink"], speed["pcie-switch"], speed["pcie"]
    assert nv is not None and sw is not None and host is not None
    assert host.decode_tok_s_1 <= sw.decode_tok_s_1 < nv.decode_tok_s_1
    assert host.decode_tok_s_per_stream < sw.decode_tok_s_per_stream < nv.decode_tok_s_per_stream
    assert host.prefill_tok_s < sw.prefill_tok_s < nv.prefill_tok_s
    assert f"tp {count} over NVLink: all-reduce ~" in nv.describe()
    assert f"tp {count} over PCIe through the CPU: all-reduce ~" in host.describe()
    assert "all-reduce over PCIe through a switch 28.3 us per extra GPU + 10 GB/s bus" in sw.inputs.explain()


def test_the_rendered_plan_names_the_interconnect_and_the_allreduce_cost(zoo: Path) -> None:
    report = report_for(zoo, "2xv100-16gb-pcie", sources=[hf("llama2-13b")], context=2048, min_context=2048)
    d = report.decision("m")
    assert d.plan is not None and d.plan.tp == 2 and d.prediction is not None
    out = io.StringIO()
    render_plan_table(report, Console(file=out, width=400, color_system=None))
    text = out.getvalue()
    assert "Tesla V100-PCIE-16GB" in text and "pairs not listed: PCIe through the CPU" in text
    work = d.prediction.inputs.workload
    per_step = f"all-reduce ~{work.allreduce_s(1) * 1e3:.2f} ms per step at 1 stream"
    assert f"tp 2 over PCIe through the CPU: {per_step}" in text
    assert work.allreduce_s(1) == pytest.approx(2 * 40 * link_for("pcie-host", (7, 0)).allreduce_s(2, 5120 * 2))


def test_a_fully_nvlinked_inventory_lists_its_links_and_no_slow_pairs(zoo: Path) -> None:
    report = report_for(zoo, "2xv100-16gb", sources=[hf("llama2-13b")], context=2048, min_context=2048)
    out = io.StringIO()
    render_plan_table(report, Console(file=out, width=400, color_system=None))
    text = out.getvalue()
    assert "NVLink to 1" in text and "NVLink to 0" in text and "pairs not listed" not in text
    assert "tp 2 over NVLink: all-reduce ~" in text


def test_a_prediction_read_back_from_json_keeps_its_link(zoo: Path) -> None:
    d = decide(zoo, "2xv100-32gb-pcie", sources=[hf("llama2-13b")], concurrency=8)
    assert d.prediction is not None
    again = type(d.prediction).model_validate_json(d.prediction.model_dump_json())
    assert again.inputs.workload.link == link_for("pcie-host", (7, 0))
    each = d.prediction.decode_tok_s_per_stream
    assert again.per_stream_at(8, d.prediction.context_tokens) == pytest.approx(each, abs=0.1)
