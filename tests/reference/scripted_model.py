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
    tmp = d.with_name(d.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tok_dir / f, tmp / f)
    shutil.rmtree(d, ignore_errors=True)
    tmp.rename(d)
    return d
