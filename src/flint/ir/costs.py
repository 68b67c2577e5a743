"""Cost rules: what one StableHLO op costs on one rank, in FLOPs and bytes.

The rules are deliberately simple and documented (README, "Cost rules") so a user can check any number
by hand from the op's shapes:

- bytes: every operand plus every result at its element size (bf16 2, f8 1, pred 1, sub-byte packed),
  except where a kernel touches less: a slice (`slice`, `dynamic_slice`, `gather`) reads only the
  elements it returns, and a `dynamic_update_slice` updates its buffer in place, reading and writing
  only the update (the buffer is neither read nor copied). How `lax.scan` reads one layer of stacked
  weights, and how a KV cache or saved activations are written, cost the slice, not the buffer;
- `dot_general`: 2 x result elements x product of contracting sizes (batch dims are in the result);
- `convolution`: 2 x batch x output features x kernel input features (already per group) x, per
  spatial dimension, the (output position, kernel tap) pairs that read a real input element: not
  padding, and not one of the zeros an lhs dilation inserts between elements (how XLA writes the
  input gradient of a strided convolution). XLA's own cost analysis counts them so too; without
  padding or dilation this is 2 x result elements x kernel window x kernel input features;
- elementwise ops: 1 FLOP per result element; transcendental ones also count 1 each in
  `transcendentals`;
- `reduce`: (input elements - result elements) x ops in the reducer body;
  `reduce_window`: result elements x window size x body ops; `sort`: elements x ceil(log2 n) x
  comparator ops; `select_and_scatter`: operand elements x body ops;
- data movement (transpose, slice, concatenate, pad, gather, scatter, broadcast, ...): 0 FLOPs, bytes;
- constants, reshapes, bitcasts and tuple plumbing: free, never emitted;
- a fusion (optimised stage): the FLOPs of the ops inside it, the bytes of its own operands and
  results, since the intermediate values never leave the kernel; by the same slice rule, an operand
  the fusion only slices counts the slices it reads, and a result that is an in-place
  `dynamic_update_slice` of an operand counts its update, that operand nothing;
- a cuBLAS call of the GPU compiler (`flint.ir.parse.LIBRARY_GEMMS`): the dot it runs, costed as
  `dot_general`, and the bytes of its operands and product (not of its scratch workspace). A fused
  epilogue (bias, activation) adds nothing, as in XLA's own cost analysis of these calls;
- a cuDNN convolution of the GPU compiler (`flint.ir.parse.LIBRARY_CONVOLUTIONS`): the convolution its
  window and dimension numbers describe, costed as `convolution` from the forward convolution's
  input, kernel and output shapes, whichever of them the call reads and writes: a backward-input or
  backward-filter call is the gradient convolution of that forward one, and its real (output
  position, kernel tap) pairs are the forward convolution's, so its FLOPs are too (zeros the
  compiler wrote into an operand before the call, padding or a dilation made explicit, are real
  elements to the call and count). Bytes: its operands and the array it writes (not its scratch
  workspace); a fused bias or activation adds nothing, as for cuBLAS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from flint.ir.parse import FUSION, Op

COMPUTE, MEMORY, COLLECTIVE, FREE = "compute", "memory", "collective", "free"

TRANSCENDENTAL = frozenset(
    "atan2 cbrt cosine exponential exponential_minus_one log log_plus_one logistic power rsqrt sine "
    "sqrt tan tanh".split()
)
ELEMENTWISE = TRANSCENDENTAL | frozenset(
    "abs add and ceil clamp compare complex convert count_leading_zeros divide floor imag is_finite "
    "map maximum minimum multiply negate not or popcnt real reduce_precision remainder "
    "round_nearest_afz round_nearest_even select shift_left shift_right_arithmetic "
    "shift_right_logical sign subtract xor".split()
)
DATA_MOVEMENT = frozenset(
    "broadcast broadcast_in_dim concatenate copy dynamic_slice dynamic_update_slice gather iota pad "
    "reverse scatter slice transpose".split()
)
NO_COST = frozenset(
    "after_all bitcast bitcast_convert constant create_token get_dimension_size get_tuple_element "
    "optimization_barrier partition_id replica_id reshape tuple".split()
)
COLLECTIVES = frozenset(
    "all_reduce all_gather reduce_scatter all_to_all ragged_all_to_all collective_permute "
    "collective_broadcast".split()
)


SLICES = frozenset({"slice", "dynamic_slice", "gather"})
"""Ops that read only the elements they return from their first operand."""
VIEWS = frozenset({"reshape", "bitcast"})
"""Ops that rename a buffer without touching it: a slice of a view reads from the buffer beneath."""


@dataclass(frozen=True)
class Gemm:
    """The matmul a GEMM kernel runs: `batch` independent [m, k] x [k, n] products of `bits`-bit
    operands. What a kernel-time model needs beyond FLOPs: how the product tiles over the chip."""

    batch: int
    m: int
    n: int
    k: int
    bits: int

    def as_list(self) -> list[int]:
        return [self.batch, self.m, self.n, self.k, self.bits]


@dataclass(frozen=True)
class Cost:
    """One op's cost on one rank. `known` is False when no rule applied and only bytes are counted."""

    kind: str
    flops: int = 0
    transcendentals: int = 0
    bytes: int = 0
    known: bool = True
    gemm: Gemm | None = None


def _taps(outputs: int, kernel: int, inputs: int, stride: int, pad_low: int, lhs_dilation: int,
          rhs_dilation: int) -> int:
    """The (output position, kernel tap) pairs of one spatial dimension that read a real input
    element of the padded, lhs-dilated input."""
    position = (np.arange(outputs)[:, None] * stride + np.arange(kernel)[None, :] * rhs_dilation - pad_low)
    real = (position >= 0) & (position <= (inputs - 1) * lhs_dilation) & (position % lhs_dilation == 0)
    return int(real.sum())


def _convolution_flops(op: Op) -> int:
    """A `convolution`'s FLOPs, or those of the forward convolution a cuDNN call's
    (input, kernel, output) describe (`flint.ir.parse.LIBRARY_CONVOLUTIONS`)."""
    lhs, kernel, result = op.attrs.get(
        "convolution", (op.operand_types[0], op.operand_types[1], op.result_types[0])
    )
    lhs, kernel, out, result = lhs.shape, kernel.shape, result.elements, result.shape
    a = op.attrs
    outputs = [result[d] for d in a["output_spatial"]]
    taps = math.prod(
        _taps(o, kernel[k], lhs[i], s, p, ld, rd)
        for o, k, i, s, p, ld, rd in zip(outputs, a["kernel_spatial"], a["input_spatial"], a["strides"],
                                         a["padding_low"], a["lhs_dilation"], a["rhs_dilation"])
    )
    return 2 * (out // max(math.prod(outputs), 1)) * kernel[a["kernel_input_feature"]] * taps


def _bytes(op: Op) -> int:
    """Operands and results; a library call's tuple result counts as its product (a gemm's, or the
    array a convolution writes), not as the scratch workspace beside it; a slice reads what it
    returns; an in-place update reads and writes its update."""
    results = [op.attrs["product"]] if "product" in op.attrs else list(op.result_types)
    operands = list(op.operand_types)
    if op.opcode in SLICES:
        operands[0] = op.result_types[0]
    elif op.opcode == "dynamic_update_slice":  # the buffer is neither read nor copied
        operands, results = operands[1:], [op.operand_types[1]]
    return sum(t.nbytes for t in operands) + sum(t.nbytes for t in results)


def _fusion_bytes(op: Op) -> int:
    """A fusion's bytes as its kernel moves them: each operand in full, or the slices of it that
    the fusion reads, or nothing where the fusion updates it in place; each result in full, or the
    update that an in-place `dynamic_update_slice` writes into its operand's buffer."""
    region = op.regions[0]
    argument = {value: i for i, value in enumerate(region.arguments)}
    producer = {value: inner for inner in region.ops for value in inner.results}

    def beneath(value: int) -> int:
        while value in producer and producer[value].opcode in VIEWS:
            value = producer[value].operands[0]
        return value

    def in_place(value: int) -> Op | None:
        """The update that writes this result into an operand's buffer, if it is one."""
        update = producer.get(beneath(value))
        if update is not None and update.opcode == "dynamic_update_slice" and beneath(update.operands[0]) in argument:
            return update
        return None

    updates = {id(u) for u in map(in_place, region.results) if u is not None}
    sliced: dict[int, int] = {}  # argument -> bytes of the slices read from it
    whole: set[int] = set()
    for inner in region.ops:
        if inner.opcode in VIEWS:
            continue
        for position, value in enumerate(inner.operands):
            i = argument.get(beneath(value))
            if i is None or (position == 0 and id(inner) in updates):
                continue
            if position == 0 and inner.opcode in SLICES:
                sliced[i] = sliced.get(i, 0) + inner.result_types[0].nbytes
            else:
                whole.add(i)
    whole.update(argument[value] for value in region.results if value in argument)
    operands = sum(t.nbytes if i in whole else min(sliced.get(i, 0), t.nbytes)
                   for i, t in enumerate(op.operand_types))
    results = sum(u.operand_types[1].nbytes if (u := in_place(value)) else t.nbytes
                  for t, value in zip(op.result_types, region.results))
    return operands + results


def _flops(op: Op) -> int | None:
    """FLOPs by the rules above, or None when the op has no rule."""
    out = op.result_types[0].elements if op.result_types else 0
    body = op.attrs.get("body_ops", 1)
    if op.opcode in ELEMENTWISE:
        return out
    if op.opcode == "convolution" or "convolution" in op.attrs:
        return _convolution_flops(op)
    if op.opcode == "dot_general" or "product" in op.attrs:
        lhs = op.operand_types[0].shape
        out = op.attrs["product"].elements if "product" in op.attrs else out
        return 2 * out * math.prod(lhs[d] for d in op.attrs["lhs_contracting"])
    if op.opcode == "dot":
        return 2 * out * op.operand_types[0].shape[-1]
    if op.opcode == "reduce":
        return (op.operand_types[0].elements - out) * body
    if op.opcode == "reduce_window":
        return out * math.prod(op.attrs["window"]) * body
    if op.opcode == "select_and_scatter":
        return op.operand_types[0].elements * body
    if op.opcode == "sort":
        shape = op.operand_types[0].shape
        longest = max(shape, default=1)
        return op.operand_types[0].elements * max(1, math.ceil(math.log2(max(longest, 2)))) * body
    if op.opcode in ("rng", "rng_bit_generator"):
        return out
    if op.opcode == "xla.rng_get_and_update_state":  # advances the step's 128-bit RNG counter
        return 0
    if op.attrs.get("target") == "GetRngSeed":  # the GPU compiler of JAX 0.12 reads the 64-bit seed
        return 0
    return None


def _gemm(op: Op, flops: int) -> Gemm | None:
    """The matmul of a `dot_general`, `dot` or cuBLAS call: batch, rows, columns and depth; of a
    convolution (or cuDNN call), the implicit GEMM it runs as: a row per output position of each
    image, a column per output feature, its `flops` over both as the depth."""
    if op.opcode == "convolution" or "convolution" in op.attrs:
        lhs, kernel, result = op.attrs.get(
            "convolution", (op.operand_types[0], op.operand_types[1], op.result_types[0]))
        window = math.prod(kernel.shape[d] for d in op.attrs["kernel_spatial"])
        n = kernel.elements // max(kernel.shape[op.attrs["kernel_input_feature"]] * window, 1)
        m = result.elements // max(n, 1)
        return Gemm(1, m, n, flops // max(2 * m * n, 1), lhs.bits)
    if op.opcode not in ("dot_general", "dot") and "product" not in op.attrs:
        return None
    lhs = op.operand_types[0]
    if op.opcode == "dot":
        contracting, batching = (len(lhs.shape) - 1,), ()
    else:
        contracting, batching = op.attrs["lhs_contracting"], op.attrs["lhs_batching"]
    out = op.attrs["product"].elements if "product" in op.attrs else op.result_types[0].elements
    batch = math.prod(lhs.shape[d] for d in batching)
    k = math.prod(lhs.shape[d] for d in contracting)
    m = lhs.elements // max(batch * k, 1)
    return Gemm(batch, m, out // max(batch * m, 1), k, lhs.bits)


KERNELS = {"dot_general": "gemm", "dot": "gemm", "convolution": "conv"}
"""A fusion (a kernel of the optimised module) that runs one of these is named after it."""


TRITON_EMITTER = "__triton"
"""The GPU compiler's backend kind for a fusion it emits as a Triton block-level kernel (rows of a
softmax or a normalization, one tile per program), which reaches a bandwidth unlike its own
loop and reduction kernels'."""


def kernel_of(op: Op) -> str | None:
    """What kind of kernel an op of the optimised module is: a fusion is `gemm` or `conv` where it
    runs a matmul or a convolution (with what the compiler fused around it), `triton` where the
    GPU compiler emits it as a Triton block-level fusion, `transpose` where it writes untiled
    transposes of the minor dimension, else `fusion` (element-wise work, reductions); a cuBLAS
    call is `gemm`, a cuDNN convolution `conv`; anything else is not a kernel."""
    if "convolution" in op.attrs:
        return "conv"
    if "product" in op.attrs:
        return "gemm"
    if op.opcode != FUSION:
        return None
    inner = {o.opcode for o in op.regions[0].ops}
    kind = next((kind for opcode, kind in KERNELS.items() if opcode in inner), None)
    if kind is not None:
        return kind
    if op.attrs.get("emitter") == TRITON_EMITTER:
        return "triton"
    return "transpose" if _writes_transposed(op) else "fusion"


def _writes_transposed(op: Op) -> bool:
    """Whether a loop fusion (`kLoop`: one thread per output element, no tiling through shared
    memory) returns transposes that move the minor dimension, each of them: the compiler names it
    `loop_*transpose*`, and one side of its copy strides across rows. A tiled transpose (`kInput`)
    runs near the bandwidth of a copy."""
    region = op.regions[0]
    producer = {value: inner for inner in region.ops for value in inner.results}
    found = [producer.get(value) for value in region.results]
    return op.attrs.get("fusion_kind") == "kLoop" and bool(found) and all(
        p is not None and p.opcode == "transpose"
        and list(p.attrs.get("permutation", ()))[-1:] != [len(p.result_types[0].shape) - 1]
        for p in found
    )


def cost_of(op: Op) -> Cost:
    """Classify `op` and cost it; collectives get their bytes from `flint.graph.collectives`."""
    if op.opcode in NO_COST:
        return Cost(FREE)
    if op.opcode in COLLECTIVES:
        return Cost(COLLECTIVE, bytes=_bytes(op))
    if op.opcode in DATA_MOVEMENT:
        return Cost(MEMORY, bytes=_bytes(op))
    if op.opcode == FUSION:
        inner = [cost_of(o) for o in op.regions[0].ops]
        gemms = [c for c in inner if c.gemm is not None]
        return Cost(
            COMPUTE,
            flops=sum(c.flops for c in inner),
            transcendentals=sum(c.transcendentals for c in inner),
            bytes=_fusion_bytes(op),
            known=all(c.known for c in inner),
            gemm=max(gemms, key=lambda c: c.flops).gemm if gemms else None,
        )
    flops = _flops(op)
    transcendentals = op.result_types[0].elements if op.opcode in TRANSCENDENTAL else 0
    if flops is None:
        return Cost(COMPUTE, bytes=_bytes(op), known=False)
    return Cost(COMPUTE, flops=flops, transcendentals=transcendentals, bytes=_bytes(op), gemm=_gemm(op, flops))
