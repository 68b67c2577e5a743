"""The communication model a reader times a trace's collectives and transfers with.

`flint timeline`, `flint inspect`, `flint simulate`'s estimator and `flint sweep` all build theirs
here: a network (`flint.step.network`, from a network file or ASTRA-sim's YAML) laid over the
trace's mesh, and NCCL's model of collectives on it (`flint.step.nccl`) or ASTRA-sim's
(`flint.step.astra_sim`).
"""

from __future__ import annotations

from collections.abc import Mapping

from flint.errors import FlintError
from flint.step.astra_sim import SYSTEM, CollectiveModel
from flint.step.nccl import NcclModel
from flint.step.network import PRESETS, mesh_axes, network_for, one_link
from flint.trace.timing import recorded_device

DEFAULT_NETWORK = "hgx"
"""The network every reader lays over the mesh unless told otherwise (`--network`)."""
COLLECTIVE_MODELS = ("nccl", "astra-sim")
"""`--collectives`: as NCCL runs them (the default), or as ASTRA-sim's analytical backend times them."""


def reader_collectives(network: str | None, manifest: Mapping | None, num_ranks: int,
                       link_gbps: float | None = None, link_latency_us: float | None = None,
                       system: Mapping | None = None, model: str = "nccl") -> CollectiveModel | NcclModel:
    """The communication model of a reader: `network` (a preset, a network file or an ASTRA-sim
    YAML file, hgx by default) over the manifest's mesh, or, given `link_gbps` or
    `link_latency_us`, one fully connected link of that bandwidth (GB/s) and latency (µs per hop;
    the other from the `flat` preset). `model` nccl: as NCCL runs collectives there
    (`flint.step.nccl`); astra-sim: as ASTRA-sim times them, reductions at the memory bandwidth of
    the manifest's device (an H100's without one), with Flint's ASTRA-sim system keys and
    `system`'s over them, as `flint simulate` writes them."""
    if model not in COLLECTIVE_MODELS:
        raise FlintError(f"unknown --collectives {model!r}: use one of {', '.join(COLLECTIVE_MODELS)}")
    if model == "nccl" and link_latency_us is not None:
        raise FlintError("--link-latency-us sets ASTRA-sim's hop latency, which NCCL's model does not use: "
                         "add --collectives astra-sim, or give --link-gbps alone")
    if network is not None and (link_gbps is not None or link_latency_us is not None):
        raise FlintError(f"--network {network} and --link-gbps or --link-latency-us each say what the network is: "
                         "give one of them")
    if link_gbps is not None or link_latency_us is not None:
        flat = PRESETS["flat"][0]
        chosen = one_link(num_ranks, flat.bandwidth_gbps if link_gbps is None else link_gbps,
                          flat.latency_ns if link_latency_us is None else link_latency_us * 1e3)
    else:
        chosen = network_for(network or DEFAULT_NETWORK, mesh_axes(dict(manifest or {}), num_ranks))
    if model == "nccl":
        return NcclModel(chosen)
    return CollectiveModel(chosen, recorded_device(manifest).mem_bw_gbps, {**SYSTEM, **(system or {})})
