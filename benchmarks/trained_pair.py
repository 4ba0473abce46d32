"""A draft/target pair of Llama checkpoints with a REAL acceptance rate and a large target shape,
built in a few minutes on one GPU (benchmarks/METHOD.md, "GPU end to end with a realistic
acceptance rate"):

1. corpus: the *.py files of this interpreter's stdlib and site-packages, walked in sorted order,
   up to --corpus-mb; the last 1% of the token stream is held out;
2. a byte-level BPE tokenizer of the shape's vocab size (<unk> <s> </s> = 0 1 2), saved into both
   checkpoints; files are joined with </s> into one flat token stream;
3. a target core (hidden 512, 8 layers, 4 heads of 128) and a draft (hidden 256, 4 layers, 2 heads)
   trained with transformers' LlamaForCausalLM for a wall-clock budget each (bf16 autocast on CUDA);
4. the core widened into --shape (benchmarks/widen.py: function kept up to noise of --noise-std);
5. saved as bf16 safetensors (target sharded with an index), and OUT/pair.json: losses, greedy
   agreement on held-out windows, teacher-forced (draft~core, core~target, draft~target; models
   evaluated in bf16 on CUDA, fp32 on CPU) and the tau_k = (1 - a^(k+1)) / (1 - a) that the
   draft~target agreement a implies (expected tokens per target forward at k drafts, if each
   position were accepted independently with probability a).

    python -m benchmarks.trained_pair OUT_DIR --shape llama-2-7b      # GPU, ~4 min
    python -m benchmarks.trained_pair /tmp/pair --tiny                 # CPU, seconds

Given --seed the data order, initialisation and widening noise are fixed; the number of steps
depends on the wall clock unless --target-steps / --draft-steps fix it.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import site
import sys
import sysconfig
import time
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.model_shapes import SHAPES
from benchmarks.widen import (WIDE_EPS, build_model, check_fits, core_eps, dims, layer_map,
                             llama_config, save_checkpoint, widen)

# (heads, layers, intermediate) of the core and the draft; hidden = heads * the shape's head_dim
FULL = dict(shape="llama-2-7b", corpus_mb=60.0, target_seconds=110.0, draft_seconds=66.0,
            batch_size=64, seq_len=512, eval_windows=64, lr=1e-3, warmup_steps=100,
            core=(4, 8, 1536), draft=(2, 4, 768))
TINY = dict(shape="tiny-wide", corpus_mb=1.0, target_seconds=6.0, draft_seconds=3.0,
            batch_size=16, seq_len=64, eval_windows=32, lr=3e-3, warmup_steps=10,
            core=(2, 2, 128), draft=(1, 1, 64))


def corpus_files(roots=None):
    """Paths of *.py files under the roots (default: stdlib, site-packages), sorted walk order."""
    if roots is None:
        paths = sysconfig.get_paths()
        roots = [paths["stdlib"], paths["purelib"], paths["platlib"], *site.getsitepackages()]
    seen = set()
    for root in dict.fromkeys(os.path.realpath(r) for r in roots):
        for d, subdirs, files in os.walk(root):
            subdirs.sort()
            for f in sorted(files):
                path = os.path.realpath(os.path.join(d, f))
                if f.endswith(".py") and path not in seen:
                    seen.add(path)
                    yield path


def read_corpus(max_mb: float, roots=None) -> list[str]:
    texts, size = [], 0
    for path in corpus_files(roots):
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            continue
        texts.append(text)
        size += len(text.encode())
        if size >= max_mb * 2**20:
            break
    return texts


def train_tokenizer(texts: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(texts, trainer)
    assert tok.token_to_id("<s>") == 1 and tok.token_to_id("</s>") == 2
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>")


def encode(tokenizer, texts: list[str]) -> torch.Tensor:
    """One flat int32 stream: file, </s>, file, </s>, ..."""
    ids = []
    backend = tokenizer.backend_tokenizer
    for enc in getattr(backend, "encode_batch_fast", backend.encode_batch)(texts):
        ids.extend(enc.ids)
        ids.append(tokenizer.eos_token_id)
    return torch.tensor(ids, dtype=torch.int32)


def autocast(device):
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else nullcontext()


def train(model, tokens, *, seconds, steps=None, batch_size, seq_len, lr, warmup_steps, seed,
          name="model"):
    """Next-token loss on random windows of `tokens` (on the model's device) for `seconds` of wall
    clock (or exactly `steps`); AdamW, warmup then cosine decay to lr/10 over the budget."""
    device = next(model.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=lr, betas=(0.9, 0.95), fused=device.type == "cuda")
    span = torch.arange(seq_len + 1, device=device)
    model.train()
    losses, step, t0, next_log = [], 0, time.perf_counter(), 0.0
    while True:
        elapsed = time.perf_counter() - t0
        progress = step / steps if steps else elapsed / seconds
        if progress >= 1:
            break
        decay = 0.1 + 0.45 * (1 + math.cos(math.pi * progress))
        for group in opt.param_groups:
            group["lr"] = lr * min(1.0, (step + 1) / warmup_steps) * decay
        offsets = torch.randint(0, len(tokens) - seq_len - 1, (batch_size,), generator=gen,
                                device=device)
        window = tokens[offsets[:, None] + span].long()
        with autocast(device):
            logits = model(input_ids=window[:, :-1]).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), window[:, 1:].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        step += 1
        if progress >= next_log:
            next_log += 0.1
            print(f"  {name}: step {step:5d}  {elapsed:6.1f}s  loss {loss.item():.3f}  "
                  f"lr {opt.param_groups[0]['lr']:.2e}", flush=True)
    tail = torch.stack(losses[-max(1, len(losses) // 20):]).mean().item()  # syncs the device
    seconds_run = time.perf_counter() - t0
    model.eval()
    return dict(steps=step, seconds=round(seconds_run, 2), tokens=step * batch_size * seq_len,
                train_loss=round(tail, 4))


@torch.no_grad()
def evaluate(model, windows, batch=8):
    """(mean next-token loss, greedy argmax at every position) on [n, seq+1] windows."""
    device = next(model.parameters()).device
    total, preds = 0.0, []
    for w in windows.split(batch):
        w = w.to(device).long()
        with autocast(device):
            logits = model(input_ids=w[:, :-1]).logits.float()
        total += F.cross_entropy(logits.flatten(0, 1), w[:, 1:].flatten(), reduction="sum").item()
        preds.append(logits.argmax(-1).cpu())
    preds = torch.cat(preds)
    return total / preds.numel(), preds


def agreement(a, b) -> float:
    return round((a == b).float().mean().item(), 4)


def tau(a: float, k: int) -> float:
    return k + 1.0 if a >= 1 else (1 - a ** (k + 1)) / (1 - a)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out_dir")
    p.add_argument("--shape", choices=sorted(SHAPES), help="target shape (default llama-2-7b; "
                   "tiny-wide with --tiny)")
    p.add_argument("--tiny", action="store_true", help="tiny core/draft/corpus/budget (CPU tests)")
    p.add_argument("--device", default="auto", choices=["auto", "cuda", "cpu"])
    for flag, kind in [("corpus-mb", float), ("target-seconds", float), ("draft-seconds", float),
                       ("batch-size", int), ("seq-len", int), ("eval-windows", int), ("lr", float),
                       ("warmup-steps", int), ("target-steps", int), ("draft-steps", int)]:
        p.add_argument("--" + flag, type=kind)
    for flag in ("core", "draft"):
        p.add_argument("--" + flag, type=lambda v: tuple(int(x) for x in v.split(",")),
                       metavar="HEADS,LAYERS,INTERMEDIATE", help=f"{flag} shape; hidden = heads * "
                       "the target's head_dim (default 4,8,1536 and 2,4,768; tiny 2,2,128, 1,1,64)")
    p.add_argument("--noise-std", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, help="torch CPU threads (1 on a busy machine)")
    p.add_argument("--shard-mb", type=float, default=4000, help="target shard size (MB)")
    p.add_argument("--save-core", action="store_true", help="also save the core to OUT/core")
    args = p.parse_args(argv)
    for k, v in (TINY if args.tiny else FULL).items():
        if getattr(args, k, None) is None:
            setattr(args, k, v)
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device, out = torch.device(args.device), Path(args.out_dir)
    if device.type == "cuda":  # an explicit index: generators and tensors must match
        device = torch.device("cuda", torch.cuda.current_device())
    out.mkdir(parents=True, exist_ok=True)
    torch.backends.cuda.matmul.allow_tf32 = True
    save_dtype = torch.bfloat16 if device.type == "cuda" else torch.float32  # eval/widen dtype
    times, t = {}, time.perf_counter()

    def lap(name):
        nonlocal t
        times[name] = round(time.perf_counter() - t, 2)
        t = time.perf_counter()

    shape = SHAPES[args.shape]
    wide_cfg = llama_config(shape["hidden_size"], shape["intermediate_size"],
                            shape["num_hidden_layers"], shape["num_attention_heads"],
                            shape["num_key_value_heads"], shape["vocab_size"],
                            shape.get("head_dim"))
    hd, vocab, H = wide_cfg["head_dim"], wide_cfg["vocab_size"], wide_cfg["hidden_size"]
    ch, cl, ci = args.core
    dh, dl, di = args.draft
    core_cfg = llama_config(ch * hd, ci, cl, ch, ch, vocab, hd, core_eps(WIDE_EPS, ch * hd, H))
    draft_cfg = llama_config(dh * hd, di, dl, dh, dh, vocab, hd)
    check_fits(core_cfg, wide_cfg)  # before any work

    texts = read_corpus(args.corpus_mb)
    corpus_bytes = sum(len(s.encode()) for s in texts)
    lap("read_corpus")
    tokenizer = train_tokenizer(texts, wide_cfg["vocab_size"])
    lap("tokenizer")
    tokens = encode(tokenizer, texts)
    del texts
    n_train = int(len(tokens) * 0.99)
    held = tokens[n_train:]
    n_win = min(args.eval_windows, len(held) // (args.seq_len + 1))
    assert n_win > 0, "held-out stream shorter than one window: raise --corpus-mb"
    windows = held[:n_win * (args.seq_len + 1)].view(n_win, args.seq_len + 1)
    train_tokens = tokens[:n_train].to(device)
    lap("encode")
    print(f"corpus: {corpus_bytes / 2**20:.1f} MB, {len(tokens)} tokens "
          f"({corpus_bytes / len(tokens):.2f} bytes/token), vocab {len(tokenizer)}", flush=True)

    common = dict(batch_size=args.batch_size, seq_len=args.seq_len, lr=args.lr,
                  warmup_steps=args.warmup_steps)
    results, preds = {}, {}
    for name, cfg, seconds, steps, seed in [
            ("core", core_cfg, args.target_seconds, args.target_steps, args.seed),
            ("draft", draft_cfg, args.draft_seconds, args.draft_steps, args.seed + 1)]:
        model = build_model(cfg, device, seed=seed)
        n_params = sum(p.numel() for p in model.parameters())
        print(f"training {name}: {n_params / 1e6:.1f}M parameters, {cfg['hidden_size']} hidden, "
              f"{cfg['num_hidden_layers']} layers", flush=True)
        stats = train(model, train_tokens, seconds=seconds, steps=steps, seed=seed, name=name,
                      **common)
        model.to(save_dtype)
        loss, preds[name] = evaluate(model, windows)
        stats["holdout_loss"] = round(loss, 4)
        results[name] = dict(params=n_params, config=cfg, **stats)
        sd = {k: v.detach() for k, v in model.state_dict().items()}
        if name == "core":
            core_sd = sd
            if args.save_core:
                save_checkpoint(out / "core", sd, core_cfg, tokenizer)
        else:
            save_checkpoint(out / "draft", sd, draft_cfg, tokenizer)
        del model
        lap(f"train_{name}")
    del train_tokens

    gen = torch.Generator(device=device).manual_seed(args.seed + 2)
    wide_sd = widen(core_sd, core_cfg, wide_cfg, args.noise_std, gen, dtype=save_dtype)
    if device.type == "cuda":
        torch.cuda.synchronize()
    lap("widen")
    save_checkpoint(out / "target", wide_sd, wide_cfg, tokenizer, int(args.shard_mb * 1e6))
    lap("save_target")
    target = build_model(wide_cfg, device, save_dtype)
    target.load_state_dict(wide_sd)
    del wide_sd
    loss, preds["target"] = evaluate(target, windows)
    results["target"] = dict(params=sum(p.numel() for p in target.parameters()), config=wide_cfg,
                             holdout_loss=round(loss, 4),
                             core_layers_at=layer_map(cl, dims(wide_cfg)["layers"]))
    del target
    lap("eval_target")

    a = agreement(preds["draft"], preds["target"])
    report = dict(
        command=" ".join(["python -m benchmarks.trained_pair", *(argv or sys.argv[1:])]),
        device=torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        shape=args.shape, noise_std=args.noise_std, seed=args.seed,
        corpus_mb=round(corpus_bytes / 2**20, 2),
        corpus_tokens=len(tokens), holdout_positions=preds["core"].numel(), seconds=times,
        models=results, agreement=dict(draft_core=agreement(preds["draft"], preds["core"]),
                                       core_target=agreement(preds["core"], preds["target"]),
                                       draft_target=a),
        tau_from_draft_target={str(k): round(tau(a, k), 3) for k in range(1, 9)},
        dirs=dict(target=str(out / "target"), draft=str(out / "draft")))
    (out / "pair.json").write_text(json.dumps(report, indent=2))
    print(f"\n{'model':<8}{'params':>10}{'steps':>7}{'tokens':>12}{'train':>8}{'holdout':>9}")
    for name in ("core", "draft", "target"):
        r = results[name]
        print(f"{name:<8}{r['params'] / 1e6:>9.1f}M{r.get('steps', '-'):>7}"
              f"{r.get('tokens', '-'):>12}{r.get('train_loss', '-'):>8}{r['holdout_loss']:>9.3f}")
    ag = report["agreement"]
    print(f"greedy agreement: draft~core {ag['draft_core']:.3f}  "
          f"core~target {ag['core_target']:.3f}  draft~target {a:.3f}   tau k=1..8: "
          + " ".join(f"{v:.2f}" for v in report["tau_from_draft_target"].values()))
    print(f"seconds: {times}  -> {out}")
    return report


if __name__ == "__main__":
    main()
