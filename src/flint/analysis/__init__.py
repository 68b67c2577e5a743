"""Tools that read traces back, beside the pipeline: `inspect`, `graph`, `timeline`, `validate`.

In: trace directories (any Chakra trace for `summary`, `dot` and `timeline`) and, for `validate`,
a model file whose step is run for real (`execution`) and compared with an extraction of it.
Out: summaries, DOT graphs, Chrome trace-event timelines, plots and validation reports, with rich
tables for the CLI (`views`).

Imports: anything below: `flint.pipeline`, the stages and `flint.trace`; nothing imports this
package but the CLI.
"""
