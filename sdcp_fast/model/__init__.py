"""Llama-family models for SDCP: loading (HF directories, GGUF), identity digests, a paged
KV cache, the batched target runner and the drafters."""
