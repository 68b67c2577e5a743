"""What times one step of a trace set on a machine, in one place: the network files
(`network_files`, `networks/*.toml`), the network they lay over the mesh (`network`), the models of
communication on it (NCCL's, `nccl`, the default; ASTRA-sim's, `astra_sim`), the reader's choice of
one (`models`), and the scheduler that runs every rank's graph with them (`schedule`).

`flint timeline`, `flint inspect`, `flint simulate` (its estimator, and the network it hands
ASTRA-sim) and `flint sweep` all time communication and schedule steps here, so they give the same
answer for the same trace.

Imports: the foundation and `trace` (node timing, the reader, the contract).
"""
