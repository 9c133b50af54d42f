"""Peers measured in the same run: HF transformers' assisted generation with the same target
checkpoint and draft, at batch 1, prompts one after another (extra ``[compare]``)."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path
from typing import Any

from sdcp_fast.bench.samples import RunSample, SessionSample
from sdcp_fast.bench.workload import Workload


def hf_unavailable(target: Any, drafter: str | None) -> str | None:
    """Why the HF peer cannot run here, or None."""
    if importlib.util.find_spec("transformers") is None:
        return "transformers is not installed (pip install 'sdcp-fast[compare]')"
    if target.name != "smollm2":
        return f"the HF peer loads the SmolLM2 checkpoint; the target is {target.name}"
    if drafter is None:
        return "no drafter to compare"
    return None


def run_hf(target: Any, drafter: str, workload: Workload) -> list[RunSample]:
    """``hf-greedy`` and ``hf-assisted:<drafter>`` (a model drafter as HF's assistant model;
    any other as HF's prompt-lookup drafter, its n-gram counterpart). Rule 1 only."""
    import tempfile

    import torch
    from transformers import AutoModelForCausalLM

    from sdcp_fast.model import loader

    path = loader.smollm2_path()
    hf_target = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    prompts = [target.prompt(p.text) for p in workload.prompts]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        kw_assisted: dict[str, Any] = {"prompt_lookup_num_tokens": 4}
        if drafter.startswith("model"):
            d = loader.load(drafter.partition(":")[2] or "smollm2-draft", borrow=target.loaded.model)
            loader.save_hf_dir(d.model, Path(tmp), dtype=torch.float32)
            kw_assisted = {"assistant_model": AutoModelForCausalLM.from_pretrained(tmp, dtype=torch.float32)}
        for name, kw in (("hf-greedy", {}), (f"hf-assisted:{drafter}", kw_assisted)):
            run = RunSample(name, 1, 0)
            hf_target.generate(torch.tensor([prompts[0]]), max_new_tokens=4, do_sample=False, **kw)  # warm-up
            t0 = time.perf_counter()
            for i, ids in enumerate(prompts):
                opened = time.perf_counter() - t0
                out = hf_target.generate(torch.tensor([ids]), max_new_tokens=workload.max_new, do_sample=False,
                                         eos_token_id=list(target.stop), **kw)
                done = time.perf_counter() - t0
                run.samples.append(SessionSample(i, workload.prompts[i].kind, opened, opened, finished=done,
                                                 tokens=int(out.shape[1] - len(ids))))
            run.wall = time.perf_counter() - t0
            runs.append(run)
    return runs
