"""Kernels on a Jupyter Kernel Gateway: `taskweaver-lite gateway` (its launch, what runs inside it, the
sandboxing provisioner) and the executor that uses any gateway (one kernel's REST and WebSocket calls)."""
