"""How the GPUs of a tensor-parallel set talk, and what an all-reduce over them costs (docs/speed-model.md).

The inventory records, per GPU, which others it reaches over NVLink and which over PCIe without crossing the
CPU (`GPU.nvlink_peers`, `GPU.switch_peers`). A set of GPUs is `nvlink` when its NVLink links join all of it,
`pcie-switch` when every pair meets below a PCIe switch, else `pcie-host` (PCIe through the CPU's root complex,
or across CPU sockets). Tensor parallelism all-reduces the hidden state twice per layer; a ring all-reduce of
`message` bytes over `tp` GPUs costs

    (tp - 1) x latency + 2 (tp - 1) / tp x message / bus bandwidth,    message = hidden x tokens x 2 (FP16)

Only the NVLink latency is measured (TurboMind tp 2 on two H200s); the rest is published or derived, and each
`Link` says which.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gateway.placement.inventory import GPU, LinkKind

NVLINK_LATENCY_S = 27.2e-6
"""One all-reduce per extra GPU over NVLink: TurboMind tp 2 on two H200s spent 1.77 ms more per step than tp 1
beyond its halved reads, over 64 all-reduces of one token's hidden state (8 KiB, so bandwidth is no part of it;
bench/results/2026-11-29-gpu-h200/turbomind/loadgen_2xv100-16gb.json vs loadgen_v100-32gb.json). An H200
measurement, taken for every NVLink generation: NCCL's own model gives all NVLink one hop latency."""
PCIE_EXTRA_LATENCY_S = 2 * (1.0 - 0.47) * 1e-6
"""What PCIe adds per extra GPU: NCCL's tuning model (src/graph/tuning.cc, `hwLat`, ring, LL protocol: 1.0 us a
hop over PCIe against 0.47 over NVLink; an all-reduce takes 2 (n - 1) hops). Published, not measured here."""
NVLINK_BUS_BYTES_S = {7: 40e9, 8: 240e9, 9: 370e9}
"""Ring bus bandwidth by compute capability major. 7 (V100 SXM2, NVLink 2.0): derived, ~2 links of 25 GB/s a
direction between ring neighbours of the hybrid cube-mesh, less NCCL's ~20 % protocol overhead. 8 (A100,
NVLink 3): derived, 12 links x 25 GB/s less 20 %. 9 (H100/H200, NVLink 4): 370 GB/s, the effective NVLink
bandwidth NCCL reaches (NVIDIA/nccl-tests#212, maintainer's comment)."""
PCIE_SWITCH_BUS_BYTES_S = 10e9
"""PCIe 3.0 x16 (a V100 PCIe card): ~12 GB/s effective a direction, less NCCL's protocol overhead. Derived from
the link's bandwidth; no published V100 PCIe all-reduce figure was found. Newer cards (PCIe 4.0/5.0) get the
same figure: pessimistic for them."""
PCIE_HOST_BUS_BYTES_S = 5e9
"""PCIe through the CPU: peer-to-peer through a root complex is slow or disabled, so NCCL stages through host
memory and each byte crosses PCIe twice: half the switch figure. Derived, unmeasured."""


@dataclass(frozen=True)
class Link:
    """The all-reduce cost of one interconnect: latency per all-reduce per extra GPU, ring bus bandwidth."""

    kind: LinkKind
    label: str
    latency_s: float
    bus_bytes_s: float

    def allreduce_s(self, tp: int, message_bytes: float) -> float:
        """One ring all-reduce of `message_bytes` over `tp` GPUs."""
        if tp <= 1:
            return 0.0
        return (tp - 1) * self.latency_s + 2 * (tp - 1) / tp * message_bytes / self.bus_bytes_s


def link_for(kind: LinkKind, compute_capability: tuple[int, int]) -> Link:
    """The all-reduce figures of `kind` between GPUs of this compute capability."""
    if kind == "nvlink":
        major = min(max(compute_capability[0], 7), 9)
        return Link(kind, "NVLink", NVLINK_LATENCY_S, NVLINK_BUS_BYTES_S[major])
    latency = NVLINK_LATENCY_S + PCIE_EXTRA_LATENCY_S
    if kind == "pcie-switch":
        return Link(kind, "PCIe through a switch", latency, PCIE_SWITCH_BUS_BYTES_S)
    return Link(kind, "PCIe through the CPU", latency, PCIE_HOST_BUS_BYTES_S)


MEASURED_NVLINK = link_for("nvlink", (9, 0))
"""What a workload built without its GPUs (tp 1, or a test of the H200 calibration) is charged."""


def interconnect_of(gpus: Sequence[GPU]) -> LinkKind:
    """NVLink when the set's NVLink links join every GPU of it (NCCL rings over them, as on a DGX-1's hybrid
    cube-mesh where not every pair is linked); else PCIe through a switch when every pair meets below one;
    else PCIe through the CPU. Meant for two GPUs or more (one GPU all-reduces nothing)."""
    indices = {g.index for g in gpus}
    if _joined_by_nvlink(gpus, indices):
        return "nvlink"
    if all(indices - {g.index} <= set(g.switch_peers) for g in gpus):
        return "pcie-switch"
    return "pcie-host"


def _joined_by_nvlink(gpus: Sequence[GPU], indices: set[int]) -> bool:
    peers = {g.index: set(g.nvlink_peers) & indices for g in gpus}
    if not peers:
        return False
    start = next(iter(peers))
    reached, frontier = {start}, [start]
    while frontier:
        for peer in peers.get(frontier.pop(), set()) - reached:
            reached.add(peer)
            frontier.append(peer)
    return reached == indices


def allreduce_step_s(link: Link, tp: int, n_layers: int, hidden_size: int, tokens: float) -> float:
    """The all-reduces of one forward pass over `tokens` tokens: two per layer, FP16 hidden states."""
    return 2 * n_layers * link.allreduce_s(tp, hidden_size * tokens * 2)
