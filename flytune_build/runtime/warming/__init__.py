"""The warm-up: which bundled configs to compile for this device and its threads (`warmup`), driving
Triton's compiler ahead of the first call (`compiler`), a launch's specialization and back (`binder`)."""
