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
and no token is ever dropped: no capacity is assumed. The routing weights scale the activation
before the down projection, so the down projection contracts experts and features at once
(`eti,ehi->th`): split over a tensor axis (the features) or an expert axis (the experts), its
partial sums are reduced once per block, over the tokens' [T, H] activations.
"""

from __future__ import annotations

import types


def _is_experts(module) -> bool:
    """A `transformers` experts module (`use_experts_implementation`) with weights stacked by expert."""
    down = getattr(module, "down_proj", None)
    return (
        hasattr(module, "_is_expert_parallel")
        and hasattr(module, "num_experts")
        and getattr(down, "dim", lambda: 0)() == 3
        and hasattr(type(module).forward, "__wrapped__")
    )


def dense_experts(module) -> list[str]:
    """Run every experts module of `module` by `dense_experts_forward`; return their names."""
    found = [name for name, sub in module.named_modules() if _is_experts(sub)]
    for name in found:
        sub = module.get_submodule(name)
        sub.forward = types.MethodType(dense_experts_forward, sub)
    return found


def dense_experts_forward(self, hidden_states, top_k_index, top_k_weights):
    """Every expert over every token [T, H], weighted by its routing weight (top_k_index and
    top_k_weights [T, k]; an index of no expert, E or more, weighs nothing)."""
    import torch

    experts = torch.arange(self.num_experts, device=hidden_states.device)
    picked = (top_k_index.unsqueeze(-1) == experts).to(top_k_weights.dtype)  # [T, k, E]
    weights = (picked * top_k_weights.unsqueeze(-1)).sum(1).t().unsqueeze(-1)  # [E, T, 1]
    x = hidden_states
    up = self.gate_up_proj if self.has_gate else self.up_proj
    if self.is_transposed:  # [E, H, out], the transpose of nn.Linear's [E, out, H]
        h = torch.einsum("th,eho->eto", x, up.to(x.dtype))
    else:
        h = torch.einsum("th,eoh->eto", x, up.to(x.dtype))
    if self.has_bias:
        h = h + (self.gate_up_proj_bias if self.has_gate else self.up_proj_bias).unsqueeze(1)
    h = self._apply_gate(h) if self.has_gate else self.act_fn(h)  # [E, T, I]
    down = self.down_proj.to(x.dtype)
    spec = "eti,eih->eth" if self.is_transposed else "eti,ehi->eth"
    if self.has_bias or self.has_post_expert_norm:
        out = torch.einsum(spec, h, down)
        if self.has_bias:
            out = out + self.down_proj_bias.unsqueeze(1)
        if self.has_post_expert_norm:
            out = self.post_expert_norm(out)
        return (out * weights).sum(0).to(hidden_states.dtype)
    return torch.einsum(spec.replace("->eth", "->th"), h * weights.to(h.dtype), down).to(hidden_states.dtype)
