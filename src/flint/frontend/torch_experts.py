"""Mixture-of-experts blocks of `transformers` models, as a step with static shapes.

`transformers` runs a block's experts (a module decorated with `use_experts_implementation`: its
weights stacked by expert, `gate_up_proj` [E, 2I, H] and `down_proj` [E, H, I]) by one of its
experts implementations. None of them gives a static graph XLA can partition by expert: `eager`
loops over the experts that received tokens (`nonzero`, data-dependent), `grouped_mm` (the
default) sorts the tokens by expert and multiplies ragged groups, and `batched_mm` gathers a copy
of the expert weights for every (token, choice) pair, so splitting the weights by expert gathers
them all.

Flint runs every such block densely instead: every expert computes over every token of the step,
and each token's output is the sum over experts of the expert's output times its routing weight,
zero for the experts the router did not pick, which is exactly what the block returns. The
compiled step therefore does E / k times the expert FLOPs of a sparse run (k experts per token),
and no token is ever dropped: no capacity is assumed. Every matmul is batched over the experts
([E, T, in] x [E, in, out]), so that splitting the experts' features (a tensor axis) or the
experts themselves (an expert axis) splits the matmuls without gathering any weight; the routing
weights scale the activation before the down projection (the same sum, as it is linear) and the
experts' outputs [E, T, H] are then summed.
"""

from __future__ import annotations

import types


def is_experts(module) -> bool:
    """A `transformers` experts module (`use_experts_implementation`) with weights stacked by expert."""
    down = getattr(module, "down_proj", None)
    return (
        hasattr(module, "_is_expert_parallel")
        and hasattr(module, "num_experts")
        and getattr(down, "dim", lambda: 0)() == 3
        and hasattr(type(module).forward, "__wrapped__")
    )


def router_parameters(module) -> list[str]:
    """Names of the routers' parameters: in each block holding experts, those with a leading
    dimension of E outside the experts (`mlp.gate.weight` [E, H]). Hugging Face's plans leave them
    whole, and a preset splitting one by shape would split the router's top-k by expert."""
    found = []
    for name, sub in module.named_modules():
        if not is_experts(sub):
            continue
        parent, _, child = name.rpartition(".")
        block = module.get_submodule(parent) if parent else module
        for pname, p in block.named_parameters():
            if not pname.startswith(f"{child}.") and p.dim() >= 1 and p.shape[0] == sub.num_experts:
                found.append(f"{parent}.{pname}" if parent else pname)
    return found


def dense_experts(module) -> list[str]:
    """Run every experts module of `module` by `dense_experts_forward`; return their names."""
    found = [name for name, sub in module.named_modules() if is_experts(sub)]
    for name in found:
        sub = module.get_submodule(name)
        sub.forward = types.MethodType(dense_experts_forward, sub)
    return found


def dense_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """Every expert over every token [T, H], weighted by its routing weight (top_k_index and
    top_k_weights [T, k]; an index of no expert, E or more, weighs nothing).

    Every matmul is batched over the experts (E the batch dimension, never merged with a split
    one). A packed `gate_up_proj` may come as [E, 2, I, H] (`torch_step.packed_shape`, never for
    transposed weights): gate and up are then its two halves, each split alike over the tensor
    axis."""
    import torch

    experts = torch.arange(self.num_experts, device=hidden_states.device)
    picked = (top_k_index.unsqueeze(-1) == experts).to(top_k_weights.dtype)  # [T, k, E]
    weights = (picked * top_k_weights.unsqueeze(-1)).sum(1).t().unsqueeze(-1)  # [E, T, 1]
    x = hidden_states.unsqueeze(0).expand(self.num_experts, *hidden_states.shape)  # [E, T, H]

    def linear(a, w):  # [E, T, in] @ w [E, out, in] (or [E, in, out] when transposed)
        return torch.bmm(a, (w if self.is_transposed else w.transpose(1, 2)).to(a.dtype))

    if self.has_gate:
        w = self.gate_up_proj
        default_gate = getattr(type(self)._apply_gate, "__name__", "") == "_default_apply_gate"
        if w.dim() == 4 and default_gate and getattr(self, "is_concatenated", True):
            # [E, 2, I, H]: gate and up apart, as the default gate splits them
            g, u = linear(x, w[:, 0]), linear(x, w[:, 1])
            if self.has_bias:
                bias = self.gate_up_proj_bias.unsqueeze(1)
                g, u = g + bias[..., : g.shape[-1]], u + bias[..., g.shape[-1] :]
            h = self.act_fn(g) * u
        else:
            if w.dim() == 4:
                w = w.flatten(1, 2)
            h = linear(x, w)
            if self.has_bias:
                h = h + self.gate_up_proj_bias.unsqueeze(1)
            h = self._apply_gate(h)
    else:
        h = linear(x, self.up_proj)
        if self.has_bias:
            h = h + self.up_proj_bias.unsqueeze(1)
        h = self.act_fn(h)  # [E, T, I]
    if not (self.has_bias or self.has_post_expert_norm):
        h = h * weights.to(h.dtype)  # weighted first: the sum over experts then adds plain outputs
    out = linear(h, self.down_proj)  # [E, T, H]
    if self.has_bias:
        out = out + self.down_proj_bias.unsqueeze(1)
    if self.has_post_expert_norm:
        out = self.post_expert_norm(out)
    if self.has_bias or self.has_post_expert_norm:
        out = out * weights.to(out.dtype)
    return out.sum(0).to(hidden_states.dtype)
