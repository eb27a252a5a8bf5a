"""A tuned kernel's call: the hot path and the tier order (`autotuner`), what every tuned kernel shares,
ported or adopted (`kernel`), how a key is decided and counted (`decision`), and the process state the
calls read and keep: the registry of tuned kernels, the offline tier of installed bundles, the scratch
cache of winners searched here, the FLYTUNE_MISSES log (docs/architecture.md, "State")."""
