"""Other tools' tuned-config formats turned into flytune artifacts (`moe`: vLLM and SGLang fused-MoE
config files); FlyDSL's format lives with its runtime adapter (`runtime.adapters.flydsl`)."""
