"""Predicted speed of a placement: decode tokens/s per stream and in total, prefill tokens/s, time to first token.

Decode is memory-bound at small batch: one step reads the weights once and every session's KV cache, and the
arithmetic only catches up at large batch, so per GPU

    step = fixed + extra sessions x per_session + max(bytes read / (COPY_EFFICIENCY x bandwidth),
                                                      2 x params x sessions / (FP16 tensor FLOPS x DECODE_MFU))

plus, with tensor parallelism, two all-reduces per layer of the step's hidden states, priced by the
interconnect of the GPUs (NVLink or PCIe, `gateway/placement/interconnect.py`), and, for layers llama.cpp
leaves on the CPU, their bytes at HOST_BANDWIDTH or their arithmetic at CPU speed,
whichever is slower. Prefill is compute-bound: 2 x params x tokens at PREFILL_MFU of the FP16 tensor FLOPS
(llama.cpp's quantised kernels at most QUANT_PREFILL_CEILING_FLOPS), plus, for layers left on the CPU, a copy
of their weights to the GPU per 512-token batch of each prompt. Time to first token is REQUEST_OVERHEAD_S plus
the prompt's prefill (the first token is sampled from the prefill's logits); `ttft_burst_s` is the last of
`sessions` prompts that arrive together, whose prefills run one after another. The plan's numbers read KV at
the session's full configured context: the speed when every session is as long as the plan promises;
`Prediction.per_stream_at` answers for another length (a benchmark's real sessions, for instance).

`fixed` and `per_session` (`StepCost`) are measured on the H200 (bench/results/2026-11-29-gpu-h200/): its
one-stream speeds are 0.27-0.66 of its bandwidth limit, but the gap is a cost per step (kernel launches,
dequantisation, sampling), not a fraction of bandwidth. Charged as a fraction, Q4_K_M on a V100 would
decode at ~60 tok/s against the ~130 published (llama.cpp discussion #15013); charged per step, at ~130.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace
from typing import Literal

from pydantic import BaseModel, ConfigDict

from backends.base import DeploymentPlan, EngineName
from gateway.config import SpeedMetric
from gateway.placement.estimate import LLAMACPP_KV_ELEMENT_BYTES, experts_on_host, kv_element_bytes
from gateway.placement.inspection import ModelShape, SourceInfo
from gateway.placement.interconnect import MEASURED_NVLINK, Link, allreduce_step_s, interconnect_of, link_for
from gateway.placement.inventory import GPU


@dataclass(frozen=True)
class GPUSpec:
    """What bounds a GPU's speed: memory bandwidth (spec sheet) and dense FP16 tensor-core throughput."""

    name: str
    bandwidth_bytes_s: float
    fp16_tflops: float
    known: bool = True


# Spec-sheet values; matched in order against NVML's name (or a simulated layout's), lower case.
GPU_TABLE: tuple[tuple[str, GPUSpec], ...] = (
    (r"v100s", GPUSpec("V100S PCIe", 1134e9, 130)),
    (r"v100.*pcie", GPUSpec("V100 PCIe", 900e9, 112)),
    (r"v100", GPUSpec("V100 SXM2", 900e9, 125)),
    (r"\bt4\b", GPUSpec("T4", 320e9, 65)),
    (r"\ba10\b", GPUSpec("A10", 600e9, 125)),
    (r"\bl4\b", GPUSpec("L4", 300e9, 121)),
    (r"a100.*40\s*gb", GPUSpec("A100 40GB", 1555e9, 312)),
    (r"a100.*pcie", GPUSpec("A100 80GB PCIe", 1935e9, 312)),
    (r"a100", GPUSpec("A100 80GB SXM", 2039e9, 312)),
    (r"h100.*pcie", GPUSpec("H100 PCIe", 2000e9, 756)),
    (r"h100.*nvl", GPUSpec("H100 NVL", 3900e9, 835)),
    (r"h100", GPUSpec("H100 SXM", 3350e9, 989)),
    (r"h200", GPUSpec("H200", 4800e9, 989)),
    (r"3090\s*ti", GPUSpec("RTX 3090 Ti", 1008e9, 80)),
    (r"3090", GPUSpec("RTX 3090", 936e9, 71)),
    (r"4090", GPUSpec("RTX 4090", 1008e9, 165)),
)
_FALLBACK = GPU_TABLE[2][1]  # an unknown GPU is predicted as a V100 SXM2, and the prediction says so

COPY_EFFICIENCY = 4257.2 / 4800
"""Streaming bandwidth reached of the spec sheet's: torch device copy on the H200, 4,257 of 4,800 GB/s
(llamacpp/copy_bandwidth.json, read + write counted)."""
DECODE_MFU = 0.5
"""Share of FP16 tensor FLOPS a batched decode step's matmuls reach (assumed: nothing here runs that large)."""
PREFILL_MFU = {"llamacpp": 0.33, "turbomind": 0.5}
"""llama.cpp: the published V100-SXM2 pp512 of 3,040 tok/s for a 7B Q4_0 (2 x 6.74e9 x 3,040 = 41 TFLOPS
of 125); F16 on the H200 reached 0.42-0.45. TurboMind: 0.46-0.52 on the H200 (1, 8 and 32 prompts of ~225
tokens at once, net of REQUEST_OVERHEAD_S). Both from bench/results/2026-12-01-gpu-h200*/pvm/."""
QUANT_PREFILL_CEILING_FLOPS = {"Q8_0": 166e12, "quant": 190e12}
"""llama.cpp's quantised matmuls (MMQ) on the H200 reach far less than its FP16 tensor cores: Q8_0 166 TFLOPS
(one prompt and eight at once agree within 5 %), Q4_K_M 130 at one ~225-token prompt and 270 at eight, taken
as 190 (the geometric middle; also used for every other quant). A ceiling, not a fraction: on a V100,
PREFILL_MFU's 41 TFLOPS stays below it and the published pp512 still holds."""
REQUEST_OVERHEAD_S = 12.5e-3
"""What a request spends outside prefill before its first token reaches the client: HTTP through the gateway
and the worker, chat template and tokenisation, the first SSE chunk. The intercept of TTFT against the tokens
prefilled (1 and 8 prompts at once) for TurboMind, llama.cpp F16 and Q8_0 on the H200 host: 12.3-13.3 ms."""
PREFILL_BATCH_TOKENS = 512
"""Tokens per prefill batch (llama.cpp's n_batch default and TurboMind's), as prefill and its all-reduces count it."""
HOST_BANDWIDTH = 32e9
"""Host memory read by llama.cpp's CPU layers: 32 GB/s on the H200 host, 8 threads (Q4_K_M with 10 of 32
layers on the CPU, one stream: 45 ms a step, 41.5 of them on the CPU for 1.34 GB; bench/results/
2026-12-01-gpu-h200-session5/pvm). The session-4 value of 50 GB/s was an assumption. Out of sample, Q8_0 with
16 layers on the CPU read at about 41 GB/s on the same host (session5/q8-partial): expect +-30 %."""
CPU_DECODE_FLOPS_PER_THREAD = 22.7e9
"""One llama.cpp thread's matmul rate in a decode step: the H200 host, Q4_K_M with 10 of 32 layers on the
CPU, 8 threads, 8 streams: 195 ms a step on the CPU for 35.5 GFLOP (bench/results/2026-12-01-gpu-h200-session5,
both prompt lengths). The session-4 value, 41e9, was derived from one stream of SmolLM2-135M Q4_1 on the
2026-11-29 CI VM (153 tok/s) as if that step were compute-bound; it predicted 142 tok/s for SmolLM2 on the
2026-12-01 CI VM, which served 61 (bench/results/2026-12-01-cpu/live-speed.json); this value predicts 81 there,
and it served 59.8 (bench/results/2026-12-01-cpu-session5/)."""
CPU_PREFILL_FLOPS_PER_THREAD = 68e9
"""One llama.cpp thread, SmolLM2-135M Q4_1: 64-token prompts in 255 ms (bench/results/2026-11-29-cpu/
batching.json)."""
PCIE_BANDWIDTH = 7e9
"""llama.cpp prefill copies CPU-resident weights to the GPU per 512-token batch of each prompt: 6.2-7.9 GB/s
on the H200 host (Q4_K_M with 10 of 32 layers on the CPU, 1 and 8 prompts at once; pageable host memory).
Out of sample, Q8_0 with 16 layers on the CPU copied at about 4.8 GB/s (session5/q8-partial). A V100's PCIe 3.0
x16 carries at most 12-13 GB/s; unmeasured there."""
PROMPT_TOKENS = 512
"""The 'typical prompt' of the TTFT prediction."""


BATCH_KNEE = 8
"""llama.cpp's batched decode grows steeply up to 8 sequences a step and slowly beyond (measured below)."""


@dataclass(frozen=True)
class StepCost:
    """Seconds a decode step costs beyond its memory reads: with one session, for each further one up to
    BATCH_KNEE, and for each beyond."""

    fixed_s: float
    per_session_s: float
    per_session_beyond_knee_s: float

    def seconds(self, sessions: float) -> float:
        extra, knee = sessions - 1, BATCH_KNEE - 1
        beyond = max(0, extra - knee) * self.per_session_beyond_knee_s
        return self.fixed_s + min(extra, knee) * self.per_session_s + beyond


# fixed: one-stream step time minus its reads (weights less the embedding, KV at the mean context) at
# 4,257 GB/s (llamacpp/llamacpp_batch1.jsonl; TurboMind: turbomind/loadgen_v100-32gb.json c=1, through
# voltgate). Per session: the step's growth per stream from 1 to 8 and from 8 to 16 streams, less its KV read
# (batching-after/batching_{f16,q8_0}_slots{8,16}.json; TurboMind: 1 to 32, linear within noise). Q4_K_M was
# measured before the one-pass fix only (llamacpp/batching_q4_k_m_slots16.json: 1.16 and 0.94 ms), scaled by
# Q8_0's gain from that fix (0.77 -> 0.57 and 0.88 -> 0.17 ms).
STEP_COSTS = {
    "turbomind": StepCost(1.94e-3, 0.012e-3, 0.012e-3),
    "llamacpp-f16": StepCost(1.63e-3, 0.38e-3, 0.19e-3),
    "llamacpp-q8_0": StepCost(2.29e-3, 0.55e-3, 0.15e-3),
    "llamacpp-quant": StepCost(2.59e-3, 0.85e-3, 0.16e-3),  # measured on Q4_K_M; taken for every other quant
    "llamacpp-cpu": StepCost(0.5e-3, 0.1e-3, 0.1e-3),  # assumed: no kernel launches, Python sampling per session
}


def gpu_spec(name: str) -> GPUSpec:
    """The table's row for a GPU name (NVML's, or a simulated layout's); a V100 SXM2 when none matches."""
    lowered = name.lower()
    for pattern, spec in GPU_TABLE:
        if re.search(pattern, lowered):
            return spec
    label = f"{name} (not in the table: predicted as a V100 SXM2)"
    return GPUSpec(label, _FALLBACK.bandwidth_bytes_s, _FALLBACK.fp16_tflops, known=False)


@dataclass(frozen=True)
class Workload:
    """What one decode step of a deployment reads and computes: per GPU (tensor parallel splits it), and on
    the host for llama.cpp layers left there. Params count multiply-adds per token."""

    engine: Literal["turbomind", "llamacpp"]
    step: StepCost
    n_layers: int
    gpu_weight_bytes: float = 0.0
    gpu_kv_bytes_per_token: float = 0.0
    gpu_params: float = 0.0
    host_weight_bytes: float = 0.0
    host_kv_bytes_per_token: float = 0.0
    host_params: float = 0.0
    tp: int = 1
    host_threads: int = 8
    prefill_ceiling_flops: float | None = None
    gpu_expert_bytes: float = 0.0
    """A mixture of experts: the routed experts' part of `gpu_weight_bytes` (all experts)."""
    host_expert_bytes: float = 0.0
    """The same of `host_weight_bytes`."""
    expert_share: float = 1.0
    """The share of the routed experts one token reads (active / all)."""
    gpu_state_bytes_per_session: float = 0.0
    """A hybrid model's recurrent state on the GPU, read and written once a step for each session."""
    hidden_size: int = 0
    """Of the model: a tensor-parallel all-reduce carries hidden_size FP16 values per token."""
    link: Link | None = None
    """The interconnect of a tensor-parallel set (None: not known, charged as the measured NVLink)."""

    @property
    def tp_link(self) -> Link:
        return self.link or MEASURED_NVLINK

    def allreduce_s(self, tokens: float) -> float:
        """The tensor-parallel all-reduces of one forward pass over `tokens` tokens (0 at tp 1)."""
        return allreduce_step_s(self.tp_link, self.tp, self.n_layers, self.hidden_size, tokens)

    def read_share(self, sessions: float) -> float:
        """The share of the routed experts a step of `sessions` tokens reads (uniform routing: each expert is
        missed by every token with probability 1 - expert_share)."""
        return 1.0 - float((1.0 - self.expert_share) ** max(sessions, 1.0))


class PredictionInputs(BaseModel):
    """What a prediction was computed from, kept so that it can be explained and recomputed for another load:
    the GPU's table row (None: on the CPU) and the decode step's reads, arithmetic and measured costs."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: GPUSpec | None
    workload: Workload
    request_overhead_s: float = REQUEST_OVERHEAD_S

    def explain(self) -> str:
        """The inputs in one line: the GPU's row, what a step reads and costs, the prefill rate."""
        w, parts = self.workload, []
        if self.gpu is not None:
            parts.append(
                f"{self.gpu.name} {self.gpu.bandwidth_bytes_s / 1e9:,.0f} GB/s, {self.gpu.fp16_tflops:g} TFLOPS FP16"
            )
            parts.append(
                f"a step reads {w.gpu_weight_bytes / 1e9:.2f} GB of weights"
                + (f" per GPU (tp {w.tp})" if w.tp > 1 else "")
                + (
                    f" ({w.gpu_expert_bytes / 1e9:.2f} GB of it routed experts: a token reads {w.expert_share:.3g} "
                    "of them, a step the union over its tokens)"
                    if w.gpu_expert_bytes
                    else ""
                )
                + f" + {w.gpu_kv_bytes_per_token / 2**10:,.0f} KiB of KV per session token"
            )
        if w.tp > 1:
            link = w.tp_link
            parts.append(
                f"all-reduce over {link.label} {link.latency_s * 1e6:.1f} us per extra GPU + "
                f"{link.bus_bytes_s / 1e9:g} GB/s bus, {w.hidden_size * 2:,} bytes per token"
            )
        if w.host_weight_bytes:
            parts.append(
                f"{w.host_weight_bytes / 1e9:.2f} GB + {w.host_kv_bytes_per_token / 2**10:,.0f} KiB/token on the "
                f"CPU ({w.host_threads} thread{'s' if w.host_threads != 1 else ''})"
            )
        parts.append(
            f"step cost {w.step.fixed_s * 1e3:.2f} ms + {w.step.per_session_s * 1e3:.2f} ms per further session"
        )
        if self.gpu is not None:
            flops = prefill_flops(w, self.gpu)
            if flops == w.prefill_ceiling_flops:
                parts.append(f"prefill at {flops / 1e12:.0f} TFLOPS (the quant's measured ceiling)")
            else:
                parts.append(f"prefill at {flops / 1e12:.0f} TFLOPS ({PREFILL_MFU[w.engine]:.2f} of FP16)")
        parts.append(f"{self.request_overhead_s * 1e3:.1f} ms request overhead")
        return "; ".join(parts)


class Prediction(BaseModel):
    """Predicted speed of one placement, from the GPU table and the measured step costs (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    gpu: str
    context_tokens: int
    decode_tok_s_1: float
    sessions: int
    decode_tok_s_per_stream: float
    aggregate_tok_s: float
    capacity_sessions: int
    capacity_tok_s: float
    prefill_tok_s: float
    ttft_s: float
    ttft_burst_s: float
    notes: tuple[str, ...] = ()
    inputs: PredictionInputs

    def score(self, metric: SpeedMetric) -> float:
        """throughput: tokens/s in total with every session it can hold decoding; latency: one stream's."""
        return self.capacity_tok_s if metric == "throughput" else self.decode_tok_s_1

    def describe(self) -> str:
        parts = [f"1 stream {self.decode_tok_s_1:,.0f} tok/s"]
        if self.sessions > 1:
            parts.append(
                f"{self.sessions} streams {self.decode_tok_s_per_stream:,.0f} tok/s each, "
                f"{self.aggregate_tok_s:,.0f} tok/s in total"
            )
        if self.capacity_sessions > self.sessions:
            parts.append(f"up to {self.capacity_sessions} streams {self.capacity_tok_s:,.0f} tok/s in total")
        ttft = f"prefill {self.prefill_tok_s:,.0f} tok/s, TTFT {self.ttft_s:.2f} s for {PROMPT_TOKENS} tokens"
        if self.sessions > 1:
            ttft += f" ({self.ttft_burst_s:.2f} s for the last of {self.sessions} arriving at once)"
        parts.append(ttft)
        tp = allreduce_note(self.inputs.workload, self.sessions)
        return "; ".join(parts + ([tp] if tp else []))

    def per_stream_at(self, sessions: float, context: int) -> float:
        """Decode tokens/s of each of `sessions` streams (a mean may be fractional) of `context` tokens each."""
        return 1 / step_seconds(self.inputs.workload, self.inputs.gpu, max(1.0, sessions), context)

    def answer_after_s(self, thinking_tokens: int) -> float:
        """Seconds to the first answer token of a reasoning model that thinks `thinking_tokens` first (one
        stream): the time to the first token, then that many decoded at one stream's speed."""
        return self.ttft_s + thinking_tokens / self.decode_tok_s_1

    def ttft_at(self, prompt_tokens: int, *, ahead: int = 0) -> float:
        """Seconds to the first token of a prompt of `prompt_tokens` with `ahead` prompts as long before it."""
        prefill = prefill_seconds(self.inputs.workload, self.inputs.gpu, prompt_tokens)
        return self.inputs.request_overhead_s + (ahead + 1) * prefill


def allreduce_note(work: Workload, sessions: int) -> str | None:
    """`tp 2 over PCIe through the CPU: all-reduce 2.3 ms per step at 1 stream, ...`; None at tp 1."""
    if work.tp <= 1:
        return None
    batch = PREFILL_BATCH_TOKENS
    text = (
        f"tp {work.tp} over {work.tp_link.label}: all-reduce ~{work.allreduce_s(1) * 1e3:.2f} ms per step at 1 stream"
    )
    if sessions > 1:
        text += f", ~{work.allreduce_s(sessions) * 1e3:.2f} ms at {sessions}"
    return text + f", ~{work.allreduce_s(batch) * 1e3:.1f} ms per {batch}-token prefill batch"


def step_seconds(work: Workload, gpu: GPUSpec | None, sessions: float, context: int) -> float:
    """One decode step with `sessions` sessions at `context` tokens each."""
    step = work.step.seconds(sessions)
    unread = 1.0 - work.read_share(sessions)  # routed experts no token of the step reads
    active = 1.0 - work.expert_share  # per token, the experts' params not computed
    if gpu is not None and work.gpu_weight_bytes:
        read = work.gpu_weight_bytes - work.gpu_expert_bytes * unread + sessions * context * work.gpu_kv_bytes_per_token
        read += sessions * work.gpu_state_bytes_per_session
        memory = read / (COPY_EFFICIENCY * gpu.bandwidth_bytes_s)
        params = work.gpu_params * (1 - active * work.gpu_expert_bytes / work.gpu_weight_bytes)
        compute = 2 * params * sessions / (gpu.fp16_tflops * 1e12 * DECODE_MFU)
        step += max(memory, compute) + work.allreduce_s(sessions)
    if work.host_weight_bytes:
        read = (
            work.host_weight_bytes - work.host_expert_bytes * unread + sessions * context * work.host_kv_bytes_per_token
        )
        params = work.host_params * (1 - active * work.host_expert_bytes / work.host_weight_bytes)
        compute = 2 * params * sessions / (work.host_threads * CPU_DECODE_FLOPS_PER_THREAD)
        step += max(read / HOST_BANDWIDTH, compute)
    return step


def prefill_flops(work: Workload, gpu: GPUSpec) -> float:
    """The FLOPS a prefill reaches on `gpu`: PREFILL_MFU of its FP16 tensor cores, at most the quant's ceiling."""
    flops = gpu.fp16_tflops * 1e12 * PREFILL_MFU[work.engine]
    return flops if work.prefill_ceiling_flops is None else min(flops, work.prefill_ceiling_flops)


def prefill_seconds(work: Workload, gpu: GPUSpec | None, tokens: int) -> float:
    """One prompt of `tokens` on an idle deployment (in 512-token batches)."""
    batches = math.ceil(tokens / PREFILL_BATCH_TOKENS)
    params = work.gpu_params + work.host_params  # a token computes only its active experts:
    weights = work.gpu_weight_bytes + work.host_weight_bytes
    params *= 1 - (1 - work.expert_share) * (work.gpu_expert_bytes + work.host_expert_bytes) / max(weights, 1)
    if gpu is None:
        return batches * work.step.fixed_s + 2 * params * tokens / (work.host_threads * CPU_PREFILL_FLOPS_PER_THREAD)
    flops = prefill_flops(work, gpu)
    seconds = batches * (work.step.fixed_s + work.allreduce_s(tokens / batches))
    seconds += 2 * params * tokens / flops  # CPU layers' matmuls run on the GPU
    return seconds + batches * work.host_weight_bytes / PCIE_BANDWIDTH


def predict(work: Workload, gpu: GPUSpec | None, *, context: int, sessions: int, capacity: int) -> Prediction:
    """Speeds at one stream, at `sessions` streams (the configured concurrency, at most what the placement
    holds) and at `capacity` (the most it decodes at once), plus prefill and TTFT for PROMPT_TOKENS."""
    capacity = max(capacity, sessions)
    one = 1 / step_seconds(work, gpu, 1, context)
    each = 1 / step_seconds(work, gpu, sessions, context)
    most = capacity / step_seconds(work, gpu, capacity, context)
    prefill = prefill_seconds(work, gpu, PROMPT_TOKENS)
    inputs = PredictionInputs(gpu=gpu, workload=work)
    notes = []
    if gpu is not None and not gpu.known:
        notes.append(f"GPU {gpu.name}")
    if gpu is not None and work.host_weight_bytes:
        notes.append(
            f"{work.host_weight_bytes / 1e9:.2f} GB of weights are read from host memory every token "
            f"(at most {HOST_BANDWIDTH / 1e9:.0f} GB/s assumed, against the GPU's "
            f"{gpu.bandwidth_bytes_s / 1e9:,.0f} GB/s)"
        )
    return Prediction(
        gpu=gpu.name if gpu is not None else f"CPU, {work.host_threads} thread{'s' if work.host_threads > 1 else ''}",
        context_tokens=context,
        decode_tok_s_1=round(one, 1),
        sessions=sessions,
        decode_tok_s_per_stream=round(each, 1),
        aggregate_tok_s=round(each * sessions, 1),
        capacity_sessions=capacity,
        capacity_tok_s=round(most, 1),
        prefill_tok_s=round(PROMPT_TOKENS / prefill, 1),
        ttft_s=round(inputs.request_overhead_s + prefill, 3),
        ttft_burst_s=round(inputs.request_overhead_s + sessions * prefill, 3),
        notes=tuple(notes),
        inputs=inputs,
    )


def _llamacpp_step(quant: str | None) -> tuple[StepCost, float | None]:
    """The measured step cost of a llama.cpp quant, and its prefill ceiling (None: FP16 tensor cores)."""
    label = (quant or "").upper()
    if label in ("F16", "BF16", "F32"):
        return STEP_COSTS["llamacpp-f16"], None
    if label == "Q8_0":
        return STEP_COSTS["llamacpp-q8_0"], QUANT_PREFILL_CEILING_FLOPS["Q8_0"]
    return STEP_COSTS["llamacpp-quant"], QUANT_PREFILL_CEILING_FLOPS["quant"]


def _expert_share(shape: ModelShape) -> float:
    """The share of a MoE's routed experts one token reads (active / all; all where the config does not say)."""
    return shape.n_experts_used / shape.n_experts if shape.n_experts and shape.n_experts_used else 1.0


def workload_for(plan: DeploymentPlan, source: SourceInfo, *, host_threads: int = 8) -> Workload:
    """What one decode step of `plan` reads and computes. The token embedding is a lookup (one row read),
    unless it doubles as the output head; llama.cpp splits layers over several GPUs in sequence, so their
    reads add up as on one GPU."""
    shape = source.shape
    params_per_byte = source.n_params / max(source.weights_bytes, 1)
    head = source.output_bytes + (source.embedding_bytes if source.tied_embeddings else 0)
    if plan.engine is EngineName.LMDEPLOY:
        read = (sum(source.layer_bytes) + head) / plan.tp
        kv_token = shape.kv_bytes_per_token(kv_element_bytes(plan.quant_policy, shape.head_dim)) / plan.tp
        step = STEP_COSTS["turbomind"]
        params = read * params_per_byte
        routed = sum(source.layer_expert_bytes) / plan.tp  # a MoE's step reads the experts its tokens route to
        return Workload(
            "turbomind", step, shape.n_layers, read, kv_token, params, tp=plan.tp, hidden_size=shape.hidden_size,
            gpu_expert_bytes=routed, expert_share=_expert_share(shape) if routed else 1.0,
        )  # fmt: skip
    n = shape.n_layers
    full = plan.n_gpu_layers < 0 or plan.n_gpu_layers > n
    first = 0 if full else n - plan.n_gpu_layers
    element = LLAMACPP_KV_ELEMENT_BYTES[plan.kv_cache_type]
    kv = [shape.layer_kv_bytes_per_token(layer, element) for layer in range(n)]
    experts = source.layer_expert_bytes or (0,) * n
    kept = sum(experts_on_host(source, plan.n_cpu_moe)[first:])  # experts of offloaded blocks kept on the host
    gpu_read = sum(source.layer_bytes[first:]) - kept + (head if full else 0) if first < n else 0
    host_read = sum(source.layer_bytes[:first]) + kept + (0 if full else head)
    step, ceiling = _llamacpp_step(plan.quant) if gpu_read else (STEP_COSTS["llamacpp-cpu"], None)
    return Workload(
        "llamacpp",
        step,
        n,
        gpu_weight_bytes=gpu_read,
        gpu_kv_bytes_per_token=sum(kv[first:]) if gpu_read else 0,
        gpu_params=gpu_read * params_per_byte,
        host_weight_bytes=host_read,
        host_kv_bytes_per_token=sum(kv[:first]),
        host_params=host_read * params_per_byte,
        host_threads=plan.llamacpp.n_threads or host_threads,
        prefill_ceiling_flops=ceiling,
        gpu_expert_bytes=sum(experts[first:]) - kept if gpu_read else 0,
        host_expert_bytes=sum(experts[:first]) + kept,
        expert_share=_expert_share(shape) if any(experts) else 1.0,
        gpu_state_bytes_per_session=shape.recurrent_state_bytes * sum(1 for b in kv[first:] if b == 0)
        if gpu_read
        else 0,
    )


def predict_plan(
    plan: DeploymentPlan, source: SourceInfo, gpus: list[GPU], *, concurrency: int, capacity: int, host_threads: int
) -> Prediction:
    """The prediction for a plan on these GPUs (the slowest of them bounds a tensor-parallel or split plan):
    `concurrency` sessions, at most `capacity` at once."""
    work = workload_for(plan, source, host_threads=host_threads)
    mine = [g for g in gpus if g.index in plan.gpu_indices]
    if work.tp > 1 and mine:
        link = link_for(interconnect_of(mine), min(g.compute_capability for g in mine))
        work = replace(work, link=link)
    used = [gpu_spec(g.name) for g in mine] if work.gpu_weight_bytes else []
    slowest = min(used, key=lambda s: s.bandwidth_bytes_s) if used else None
    sessions = min(concurrency, capacity)
    return predict(work, slowest, context=plan.context_tokens, sessions=sessions, capacity=capacity)
