"""Reference workloads that need only Debian's python3-torch (+ python3-sklearn for digits).

- ``p2ptrain.workloads.digits:Digits``  MLP on sklearn's bundled 8x8 digits
- ``p2ptrain.workloads.charlm:CharLM``  byte-level GRU language model on the stdlib's sources
- ``p2ptrain.workloads.lm:LM``          decoder-only transformer over bytes (tiny/small/base presets)
- ``p2ptrain.workloads.bench:Bench``    a model of configurable size for pack benchmarks
"""
