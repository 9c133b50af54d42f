"""The target and draft models for SDCP: one decoder-only transformer with per-family switches
(Llama, Qwen2/3, Mistral, Gemma 2/3, Phi-3; docs/models.md), loading (HF directories, GGUF),
quantized CPU weights (``quant_weights``), the digests a contract names
(``contract_digests``), a paged KV cache (``kv_cache``) and its pages as bytes
(``kv_transfer``), the batched target scorer (``target_scorer``) and the drafters."""
