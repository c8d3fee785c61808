"""Tiny DeepSeek-V3 checkpoints *scripted* to write a known text, for server tests that
need a real tokenizer's output (reasoning tags, tool-call markers) to come out of the
real engine, detokenizer and server.

Attention and MLP outputs are zero, so the residual stream is the current token's
embedding, and embeddings / lm_head form a successor table: greedy decoding after
`chain[0]` writes chain[1:], ending with the end-of-sentence id. Tokens in a chain must
be distinct (one successor each). transformers' own greedy generate on the checkpoint
is checked to give the chain before the files are kept.
"""
import shutil

from conftest import cache_dir, content_key

HIDDEN = 64
FIXTURE_VERSION = 1


def token_id(tok, piece):
    ids = tok.encode(piece, add_special_tokens=False)
    assert len(ids) == 1, (piece, ids)
    return ids[0]


def _save(model, tok_dir, d):
    """The checkpoint and the tokenizer's files into `d`, atomically."""
    tmp = d.with_name(d.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / f, tmp / f)
    shutil.rmtree(d, ignore_errors=True)
    tmp.rename(d)
    return d


def scripted_deepseek(name, tok_dir, tok, prompt, chain):
    """A checkpoint directory (cached by content) whose greedy continuation of `prompt`
    (token ids ending with chain[0]) is chain[1:]."""
    import torch
    import transformers
    key = content_key(FIXTURE_VERSION, chain, prompt, HIDDEN, transformers.__version__,
                      (tok_dir / "tokenizer_config.json").read_text())
    d = cache_dir() / f"{name}-{key}"
    if (d / "model.safetensors").exists():
        return d
    assert prompt[-1] == chain[0]
    assert len(set(chain)) == len(chain) and len(chain) <= HIDDEN, chain
    eos = chain[-1]
    cfg = transformers.DeepseekV3Config(
        vocab_size=len(tok), hidden_size=HIDDEN, intermediate_size=64, moe_intermediate_size=16,
        num_hidden_layers=1, first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2,
        n_group=1, topk_group=1, num_attention_heads=2, num_key_value_heads=2, q_lora_rank=None,
        kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
        n_shared_experts=1, max_position_embeddings=512, tie_word_embeddings=False,
        bos_token_id=tok.bos_token_id, eos_token_id=eos, pad_token_id=None)
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(cfg).float().eval()
    with torch.no_grad():
        layer = model.model.layers[0]
        layer.self_attn.o_proj.weight.zero_()
        layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.lm_head.weight.zero_()
        for i, (a, b) in enumerate(zip(chain[:-1], chain[1:])):
            model.model.embed_tokens.weight[a, i] = 1.0
            model.lm_head.weight[b, i] = 10.0
        # The reference: transformers' greedy continuation is the script.
        out = model.generate(torch.tensor([prompt]), max_new_tokens=len(chain) + 2,
                             do_sample=False, eos_token_id=eos, pad_token_id=0)
    assert out[0, len(prompt):].tolist() == chain[1:]
    return _save(model, tok_dir, d)


def scripted_by_position(name, tok_dir, tok, prompt, script):
    """A checkpoint directory (cached by content) whose greedy continuation of exactly
    `prompt` (token ids) is `script` (ids, repeats allowed, ending with end of sentence).

    Here the next token depends on the position, not on the current token: queries are
    zero, so attention averages the values of every position so far uniformly; only
    the prompt's first token (the marker) has a non-zero value, so the attention output
    is (markers so far) / (position + 1), a number that falls with each position. The
    dense MLP turns it into one triangular bump per script step (three SiLU units: at
    the centre -2, half a gap either side +1, the gap taken from the measured values),
    each bump writes its own hidden slot, and lm_head maps slot k to script[k].
    """
    import torch
    import transformers
    key = content_key(FIXTURE_VERSION, "position", script, prompt, transformers.__version__,
                      (tok_dir / "tokenizer_config.json").read_text())
    d = cache_dir() / f"{name}-{key}"
    if (d / "model.safetensors").exists():
        return d
    n_steps = len(script)
    hidden = 64
    assert n_steps <= hidden - 3, n_steps
    marker = prompt[0]
    assert marker not in script
    CONST, SIGNAL, MARK = 0, 1, hidden - 1  # hidden dims; slots 2.. are the steps
    cfg = transformers.DeepseekV3Config(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=3 * n_steps,
        moe_intermediate_size=16, num_hidden_layers=1, first_k_dense_replace=1,
        n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
        num_attention_heads=2, num_key_value_heads=2, q_lora_rank=None, kv_lora_rank=16,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_shared_experts=1,
        max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=tok.bos_token_id,
        eos_token_id=script[-1], pad_token_id=None)
    torch.manual_seed(0)
    model = transformers.DeepseekV3ForCausalLM(cfg).float().eval()
    seq = prompt + script[:-1]
    with torch.no_grad():
        layer = model.model.layers[0]
        attn, mlp = layer.self_attn, layer.mlp
        for w in (model.model.embed_tokens.weight, model.lm_head.weight, attn.q_proj.weight,
                  attn.kv_a_proj_with_mqa.weight, attn.kv_b_proj.weight, attn.o_proj.weight,
                  mlp.gate_proj.weight, mlp.up_proj.weight, mlp.down_proj.weight):
            w.zero_()
        model.model.embed_tokens.weight[:, CONST] = 1.0
        model.model.embed_tokens.weight[marker, MARK] = 1.0
        attn.kv_a_proj_with_mqa.weight[0, MARK] = 1.0           # latent 0: the marker
        attn.kv_b_proj.weight[cfg.qk_nope_head_dim, 0] = 1.0     # head 0's value 0
        attn.o_proj.weight[SIGNAL, 0] = 1.0
        # Measure the signal the MLP sees at each position: SIGNAL over CONST after the
        # norm is the attention average, whatever the norm's scale.
        seen = {}
        hook = mlp.register_forward_hook(lambda m, a, o: seen.update(x=a[0][0].clone()))
        model(torch.tensor([seq]))
        hook.remove()
        x = seen["x"]
        signal = (x[:, SIGNAL] / x[:, CONST]).double()
        steps = signal[len(prompt) - 1:]
        gaps = (steps[:-1] - steps[1:]).abs()
        assert len(steps) == n_steps and (n_steps == 1 or gaps.min() > 1e-4)
        half = 0.4 * (gaps.min().item() if n_steps > 1 else 1.0)
        gain = 40.0 / half  # SiLU ~ ReLU: a bump's peak is ~40 units of gate
        for k in range(n_steps):
            centre = steps[k].item()
            for j, (offset, weight) in enumerate(((-half, 1.0), (0.0, -2.0), (half, 1.0))):
                unit = 3 * k + j
                mlp.gate_proj.weight[unit, SIGNAL] = gain
                mlp.gate_proj.weight[unit, CONST] = -gain * (centre + offset)
                mlp.up_proj.weight[unit, CONST] = 1.0
                mlp.down_proj.weight[2 + k, unit] = weight
            model.lm_head.weight[script[k], 2 + k] = 10.0
        # The reference: transformers' greedy continuation is the script.
        # (An explicit mask: generate() would infer one from pad_token_id and hide a
        # prompt token that happens to share its id.)
        ids = torch.tensor([prompt])
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=n_steps + 2,
                             do_sample=False, eos_token_id=script[-1], pad_token_id=script[-1])
    assert out[0, len(prompt):].tolist() == script, (out[0, len(prompt):].tolist(), script)
    return _save(model, tok_dir, d)
