"""Tools that read traces back, beside the pipeline: `inspect`, `graph`, `timeline`, `validate`,
`calibrate` (a device to profiled steps, a network to nccl-tests output).

In: trace directories (any Chakra trace for `summary`, `dot` and `timeline`) and, for `validate`,
a model file whose step is run for real (`execution`) and compared with an extraction of it.
Out: summaries, DOT graphs, Chrome trace-event timelines (of `flint.step`'s schedule), plots,
validation reports and fits, with rich tables for the CLI (`views`).

Imports: anything below: `flint.step`, `flint.pipeline`, the stages and `flint.trace`; nothing
imports this package but the CLI.
"""
