"""The communication model a reader times a trace's collectives and transfers with.

`flint timeline`, `flint inspect`, `flint simulate`'s estimator and `flint sweep` all build theirs
here: a network (`flint.step.network`, from a network file or ASTRA-sim's YAML) laid over the
trace's mesh, and NCCL's model of collectives on it (`flint.step.nccl`) or ASTRA-sim's
(`flint.step.astra_sim`).
"""

from __future__ import annotations

from collections.abc import Mapping

from flint.devices import Device
from flint.errors import FlintError
from flint.step.astra_sim import SYSTEM, CollectiveModel
from flint.step.nccl import NcclModel
from flint.step.network import PRESETS, Network, mesh_axes, network_for, one_link
from flint.trace.timing import recorded_device

DEFAULT_NETWORK = "hgx"
"""The network every reader lays over the mesh unless told otherwise (`--network`)."""
COLLECTIVE_MODELS = ("nccl", "astra-sim")
"""`--collectives`: as NCCL runs them (the default), or as ASTRA-sim's analytical backend times them."""


def collective_model(model: str, network: Network, device: Device,
                     system: Mapping | None = None) -> CollectiveModel | NcclModel:
    """The one place a reader and `flint simulate`'s estimator build their model of collectives on
    `network`: `model` nccl, as NCCL runs them (`flint.step.nccl`); astra-sim, as ASTRA-sim times
    them (`flint.step.astra_sim`), with Flint's ASTRA-sim system keys and `system`'s (a `--system`
    file's) over them, and each reduction at `local-mem-bw`: `system`'s where it gives one, else
    `device`'s memory bandwidth (the device compute is timed on), as `flint simulate` writes it into
    ASTRA-sim's system file."""
    if model not in COLLECTIVE_MODELS:
        raise FlintError(f"unknown --collectives {model!r}: use one of {', '.join(COLLECTIVE_MODELS)}")
    if model == "nccl":
        if len(network.dimensions) > 2:  # only an ASTRA-sim YAML has more: a network file has two tiers
            raise FlintError(f"network {network.name} has {len(network.dimensions)} dimensions, and NCCL's model "
                             "knows two (a node, and the NICs between nodes): give --collectives astra-sim, or a "
                             "network file (.toml) of the cluster")
        return NcclModel(network)
    keys = {**SYSTEM, **(system or {})}
    return CollectiveModel(network, keys.get("local-mem-bw", device.mem_bw_gbps), keys)


def reader_collectives(network: str | None, manifest: Mapping | None, num_ranks: int,
                       link_gbps: float | None = None, link_latency_us: float | None = None,
                       system: Mapping | None = None, model: str = "nccl",
                       device: Device | None = None) -> CollectiveModel | NcclModel:
    """The communication model of a reader: `network` (a preset, a network file or an ASTRA-sim
    YAML file, hgx by default) over the manifest's mesh, or, given `link_gbps` or
    `link_latency_us`, one fully connected link of that bandwidth (GB/s) and latency (µs per hop;
    the other from the `flat` preset). `model` nccl: as NCCL runs collectives there
    (`flint.step.nccl`); astra-sim: as ASTRA-sim times them (`collective_model`), reductions at the
    memory bandwidth of `device` (the reader's `--device`; without one, the manifest's device, an
    H100's without that), with Flint's ASTRA-sim system keys and `system`'s over them, as `flint
    simulate` writes them."""
    if model == "nccl" and link_latency_us is not None:
        raise FlintError("--link-latency-us sets ASTRA-sim's hop latency, which NCCL's model does not use: "
                         "add --collectives astra-sim, or give --link-gbps alone")
    if network is not None and (link_gbps is not None or link_latency_us is not None):
        raise FlintError(f"--network {network} and --link-gbps or --link-latency-us each say what the network is: "
                         "give one of them")
    if link_gbps is not None or link_latency_us is not None:
        flat = PRESETS["flat"][0]
        chosen = one_link(num_ranks, flat.bandwidth_gbps if link_gbps is None else link_gbps,
                          flat.latency_ns if link_latency_us is None else link_latency_us * 1e3,
                          latency_named=model != "nccl")
    else:
        chosen = network_for(network or DEFAULT_NETWORK, mesh_axes(dict(manifest or {}), num_ranks))
    return collective_model(model, chosen, device or recorded_device(manifest), system)
