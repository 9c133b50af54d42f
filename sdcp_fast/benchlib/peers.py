"""Peers measured in the same run: HF transformers with the same target weights, greedy and
assisted generation with the same draft, at batch 1, prompts one after another (extra
``[compare]``). The in-process peer of a networked run is the harness's own in-process path."""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Callable
from typing import Any

from sdcp_fast.benchlib.samples import RunSample, SessionSample
from sdcp_fast.benchlib.workload import Workload


def hf_unavailable(target: Any, drafter: str | None) -> str | None:
    """Why the HF peer cannot run here, or None."""
    if importlib.util.find_spec("transformers") is None:
        return "transformers is not installed (pip install 'sdcp-fast[compare]')"
    if target.loaded is None:
        return f"the {target.name} target has no weights to hand to transformers"
    if target.loaded is not None and next(target.loaded.model.parameters()).device.type != "cpu":
        return "the HF peer runs on the CPU; the target is on another device"
    if drafter is None:
        return "no drafter to compare"
    return None


class _Stream:
    """What ``generate`` hands a streamer: the prompt once, then the tokens of each step (several
    at once when assisted), so TTFT and inter-token latency are measured as in the harness."""

    def __init__(self, sample: SessionSample, t0: float) -> None:
        self.sample, self.t0, self.prompt_seen = sample, t0, False

    def put(self, value: Any) -> None:
        if not self.prompt_seen:
            self.prompt_seen = True
            return
        now = time.perf_counter() - self.t0
        if self.sample.first is None:
            self.sample.first = now
        self.sample.chunks.append((now, int(value.numel())))

    def end(self) -> None:
        pass


def _dtype(torch: Any) -> dict[str, Any]:
    """fp32 weights, under the keyword this transformers version takes (``dtype`` from 4.56)."""
    import transformers

    major, minor = (int(x) for x in transformers.__version__.split(".")[:2])
    return {"dtype" if (major, minor) >= (4, 56) else "torch_dtype": torch.float32}


_LOADED: dict[bytes, Any] = {}  # by the target's digest: the greedy and the assisted run share one


def _hf_target(target: Any) -> Any:
    """The target's own weights as an HF model: what it computes then differs from ours only in
    the implementation (reading the GGUF with transformers gives the same tensors, max
    difference 0 for SmolLM2, at 25 times the time)."""
    import tempfile
    from pathlib import Path

    import torch
    import transformers
    from transformers import AutoModelForCausalLM

    from sdcp_fast.model import loader

    if target.digest not in _LOADED:
        transformers.logging.set_verbosity_error()  # its load report and progress bars would break the display
        transformers.logging.disable_progress_bar()
        with tempfile.TemporaryDirectory() as tmp:
            loader.save_hf_dir(target.loaded.model, Path(tmp), dtype=torch.float32)
            _LOADED.clear()
            _LOADED[target.digest] = AutoModelForCausalLM.from_pretrained(tmp, **_dtype(torch))
    return _LOADED[target.digest]


def _assisted(target: Any, drafter: str, tmp: str) -> dict[str, Any]:
    """HF's arguments for the same draft: a model drafter as the assistant model (our weights
    written as an HF checkpoint), any other as HF's prompt-lookup drafter, its n-gram counterpart."""
    if not drafter.startswith("model"):
        return {"prompt_lookup_num_tokens": 4}
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM

    from sdcp_fast.model import loader

    d = loader.load(drafter.partition(":")[2] or "smollm2-draft", borrow=target.loaded.model)
    loader.save_hf_dir(d.model, Path(tmp), dtype=torch.float32)
    return {"assistant_model": AutoModelForCausalLM.from_pretrained(tmp, **_dtype(torch))}


def run_hf(target: Any, drafter: str | None, name: str, workload: Workload, repeats: int, *,
           on_session: Callable[[], None] | None = None) -> list[RunSample]:
    """``repeats`` runs of ``workload`` through HF ``generate``: greedy (``drafter`` None) or
    assisted by ``drafter``. Rule 1 only; one warm-up generation first, not measured."""
    import tempfile

    import torch

    hf = _hf_target(target)
    prompts = [target.prompt(p.text) for p in workload.prompts]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        kw = {} if drafter is None else _assisted(target, drafter, tmp)
        hf.generate(torch.tensor([prompts[0]]), max_new_tokens=min(8, workload.max_new), do_sample=False, **kw)
        for k in range(repeats):
            run = RunSample(name, 1, k)
            t0 = time.perf_counter()
            for i, ids in enumerate(prompts):
                opened = time.perf_counter() - t0
                sample = SessionSample(i, workload.prompts[i].kind, opened, opened)
                out = hf.generate(torch.tensor([ids]), max_new_tokens=workload.max_new, do_sample=False,
                                  eos_token_id=list(target.stop), streamer=_Stream(sample, t0), **kw)
                sample.finished = time.perf_counter() - t0
                tokens = out[0, len(ids):].tolist()
                sample.tokens, sample.output = len(tokens), tokens
                sample.finish = "length" if len(tokens) >= workload.max_new else "stop"
                run.samples.append(sample)
                if on_session is not None:
                    on_session()
            run.wall = time.perf_counter() - t0
            runs.append(run)
    return runs
