"""Other tools' tuned-config formats turned into flytune artifacts and back: `moe` (vLLM and SGLang
fused-MoE config files) and `flydsl` (FlyDSL's offline configs; its run-time part is
`runtime.adapters.flydsl`)."""
