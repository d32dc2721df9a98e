"""The project's benchmark suite: problems in three levels, each run eagerly, with Inductor and
with the cuda_agent backend, checked against eager and timed interleaved on one GPU.

    python -m benchmarks.suite --help
"""
