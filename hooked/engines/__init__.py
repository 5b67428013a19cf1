"""Inference engines that run hooked's own modules: `hooked.engines.vllm` (a spike, issue 38)."""
