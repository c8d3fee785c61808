"""The third-party quantisers the reference tests make checkpoints with (llmcompressor's
oneshot, msmodelslim's calibrator), each run in a child Python process.

Both patch global state when imported or run: `import msmodelslim` assigns its own
subclass to `pydantic.BaseModel` in every loaded pydantic module (after which the
openai SDK refuses the models the tests defined earlier), and llmcompressor registers
transformers' checkpoint conversion mappings. Run inside pytest, that would change
the behaviour of every test after the one that first built a fixture, so a fresh
machine (empty fixture cache) would test something else than a warm one. The child
reads its inputs from and writes its outputs to directories; the callers cache them.

The test modules call `run(name, **arguments)`; `python quantisers.py NAME JSON` is
the child's side.
"""
import contextlib
import importlib.metadata
import json
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent


def version(package):
    """The installed version of a package (part of fixture cache keys), read from its
    metadata so that the package is never imported here; None when absent."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def run(name, **arguments):
    """Runs quantiser `name` in a child process; raises with its stderr on failure."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(HERE)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    r = subprocess.run([sys.executable, str(HERE / "quantisers.py"), name,
                        json.dumps(arguments, default=str)],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        raise RuntimeError(f"quantiser {name} exited {r.returncode}\n{r.stderr[-6000:]}")


def word_level_tokenizer(vocab):
    """A word-level tokenizer over the ids 0..vocab-1 (saved beside the tiny float
    checkpoints; llmcompressor wants a processor to save)."""
    import transformers
    from tokenizers import Tokenizer, models
    return transformers.PreTrainedTokenizerFast(tokenizer_object=Tokenizer(
        models.WordLevel({str(i): i for i in range(vocab)}, unk_token="0")))


# ---- the child's side: everything below runs only in the child process ----

def _random_ids_dataset(vocab, seed, rows=16, length=64):
    import torch
    from datasets import Dataset
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, length), generator=g)
    return Dataset.from_dict({"input_ids": ids.tolist(),
                              "attention_mask": torch.ones_like(ids).tolist()})


def _w8a8_recipe(static):
    """llmcompressor's W8A8 preset (dynamic per-token activations), or static per-tensor
    activations with per-channel weights."""
    from llmcompressor.modifiers.quantization import QuantizationModifier
    if not static:
        return QuantizationModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"])
    int8 = dict(num_bits=8, type="int", symmetric=True)
    return QuantizationModifier(ignore=["lm_head"], config_groups={"group_0": {
        "targets": ["Linear"],
        "weights": dict(int8, strategy="channel", dynamic=False),
        "input_activations": dict(int8, strategy="tensor", dynamic=False),
    }})


def llmcompressor_w8a8(float_dir, out_dir, vocab, seed, static):
    """A dense (Llama, Qwen2) float checkpoint quantised one-shot on random ids."""
    import torch
    import transformers
    from llmcompressor import oneshot
    model = transformers.AutoModelForCausalLM.from_pretrained(float_dir, dtype=torch.float32)
    oneshot(model=model, dataset=_random_ids_dataset(vocab, seed), recipe=_w8a8_recipe(static),
            processor=word_level_tokenizer(vocab), num_calibration_samples=16,
            max_seq_length=64)
    model.save_pretrained(out_dir, save_compressed=True)


def llmcompressor_deepseek_w8a8(float_dir, out_dir, vocab, seed):
    """A DeepSeek float checkpoint loaded with its MoE experts linearised (so that every
    expert is calibrated) and quantised with the W8A8 preset, router gates in float;
    saved one tensor per expert projection."""
    import torch
    import transformers
    from llmcompressor import oneshot
    from llmcompressor.modeling.moe.linearize import load_quantizable_moe
    from llmcompressor.modifiers.quantization import QuantizationModifier
    with load_quantizable_moe():
        model = transformers.AutoModelForCausalLM.from_pretrained(float_dir, dtype=torch.float32)
    recipe = QuantizationModifier(targets="Linear", scheme="W8A8",
                                  ignore=["lm_head", "re:.*mlp.gate$"])
    oneshot(model=model.eval(), dataset=_random_ids_dataset(vocab, seed), recipe=recipe,
            processor=word_level_tokenizer(vocab), num_calibration_samples=16,
            max_seq_length=64)
    model.save_pretrained(out_dir, save_compressed=True)


def llmcompressor_smoothquant_w8a8(bf16_dir, out_dir, calibration_rows):
    """llmcompressor's W8A8 recipe as its docs give it, without GPTQ (18 minutes on a
    2-core machine for SmolLM2-135M): SmoothQuant moves the activations' outlier
    channels into the weights, then int8 per-channel weights and dynamic per-token int8
    activations, lm_head in float. Calibrated on the token rows in calibration_rows
    (a JSON list of lists)."""
    import torch
    import transformers
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.quantization import QuantizationModifier
    from llmcompressor.modifiers.smoothquant import SmoothQuantModifier
    rows = json.loads(pathlib.Path(calibration_rows).read_text())
    tok = transformers.AutoTokenizer.from_pretrained(bf16_dir)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        bf16_dir, dtype=torch.bfloat16).eval()
    data = Dataset.from_dict({"input_ids": rows, "attention_mask": [[1] * len(r) for r in rows]})
    recipe = [SmoothQuantModifier(smoothing_strength=0.8),
              QuantizationModifier(targets="Linear", scheme="W8A8", ignore=["lm_head"])]
    oneshot(model=model, dataset=data, processor=tok, num_calibration_samples=len(rows),
            max_seq_length=max(map(len, rows)), recipe=recipe)
    model.save_pretrained(out_dir, save_compressed=True)
    tok.save_pretrained(out_dir)


def msmodelslim_w8a8(float_dir, out_dir, vocab, seed, static):
    """msmodelslim's one-shot W8A8 on the CPU (min-max activations) of a dense float
    checkpoint, its files renamed to what vllm-ascend reads (model.safetensors,
    quant_model_description.json)."""
    import torch
    import transformers
    from msmodelslim.pytorch.llm_ptq.llm_ptq_tools import Calibrator, QuantConfig
    model = transformers.AutoModelForCausalLM.from_pretrained(float_dir, dtype=torch.float32)
    model = model.eval()
    config = QuantConfig(w_bit=8, a_bit=8, disable_names=["lm_head"], dev_type="cpu",
                         act_method=1, is_dynamic=not static)
    g = torch.Generator().manual_seed(3000 + seed)
    data = [[torch.randint(0, vocab, (1, 64), generator=g)] for _ in range(4)]
    out_dir = pathlib.Path(out_dir)
    # Its calibrator leaves a features.npy in the working directory: run it in out_dir's.
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.chdir(out_dir.parent):
        calibrator = Calibrator(model, config, calib_data=data, disable_level="L0")
        calibrator.run()
    raw = out_dir.with_name("raw")
    calibrator.save(str(raw), save_type=["safe_tensor"])
    out_dir.mkdir(parents=True)
    (weights,) = raw.glob("quant_model_weight_*.safetensors")
    (description,) = raw.glob("quant_model_description_*.json")
    weights.rename(out_dir / "model.safetensors")
    description.rename(out_dir / "quant_model_description.json")
    model.config.save_pretrained(out_dir)


QUANTISERS = {f.__name__: f for f in (llmcompressor_w8a8, llmcompressor_deepseek_w8a8,
                                      llmcompressor_smoothquant_w8a8, msmodelslim_w8a8)}

if __name__ == "__main__":
    QUANTISERS[sys.argv[1]](**json.loads(sys.argv[2]))
