"""Inference engines that run hooked's own modules: `hooked.engines.vllm` (a preview, issue 38)."""
