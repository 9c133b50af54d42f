"""Llama-family models for SDCP: loading (HF directories, GGUF), the digests a contract names
(``contract_digests``), a paged KV cache (``kv_cache``) and its pages as bytes
(``kv_transfer``), the batched target scorer (``target_scorer``) and the drafters."""
