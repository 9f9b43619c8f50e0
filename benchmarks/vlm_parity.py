"""Qwen2.5-VL against transformers 5 on tests/test_qwen2_5_vl_model.py's tiny model and batch
(float32; 4 left-padded rows: images of 16x16 and 24x32, two images, text only): teacher-forced
logits, the cached sampler's log-probs against transformers' log-softmax on the sampled
sequence, and our export reloaded by transformers. Prints JSON lines of max abs differences.

    python benchmarks/vlm_parity.py
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import numpy as np, torch, jax
from tests.test_qwen2_5_vl_model import models as models_fixture, batch, hf_inputs, IMAGE
from grpo_jax.models.vision.qwen2_5_vl_model import vlm_logits
from grpo_jax.rollout.vlm_sampler import vlm_sample
model, cfg, params = models_fixture.__wrapped__()
ids, mask, pixels, grid = batch()
with torch.no_grad():
  theirs = model(**hf_inputs(ids, mask, pixels, grid)).logits.numpy()
ours = np.asarray(vlm_logits(params, ids, mask, pixels, grid, cfg))
real = mask.astype(bool)
img_rows = (ids == IMAGE).any(1)
out = {"teacher_forced_image_rows": float(np.abs(ours - theirs)[real & img_rows[:, None]].max()),
       "teacher_forced_text_only_rows": float(np.abs(ours - theirs)[real & ~img_rows[:, None]].max())}
# cached decode: our sampler's log-probs vs HF's log-softmax on the sampled sequence
N = 12
tok, logp, live = vlm_sample(params, ids, mask, pixels, grid, jax.random.key(0), cfg, N, 1.0, 1)
tok, logp = np.asarray(tok), np.asarray(logp)
full = np.concatenate([ids, tok], 1); fmask = np.concatenate([mask, np.ones_like(tok)], 1)
inp = hf_inputs(full, fmask, pixels, grid)
with torch.no_grad():
  lg = model(**inp).logits.float()
lsm = torch.log_softmax(lg, -1).numpy()
P = ids.shape[1]
hf_logp = np.take_along_axis(lsm[:, P - 1:-1], tok[..., None], -1)[..., 0]
d = np.abs(hf_logp - logp)
out["cached_decode_image_rows"] = float(d[img_rows].max())
out["cached_decode_text_only_rows"] = float(d[~img_rows].max())
print(json.dumps(out))
import tempfile
from grpo_jax.models.hf_export import export_vlm_checkpoint
from transformers import Qwen2_5_VLForConditionalGeneration
d = tempfile.mkdtemp()
export_vlm_checkpoint(params, cfg, d)
back = Qwen2_5_VLForConditionalGeneration.from_pretrained(d, attn_implementation="eager").eval()
with torch.no_grad():
  again = back(**hf_inputs(ids, mask, pixels, grid)).logits.numpy()
print(json.dumps({"export_reloaded_vs_ours": float(np.abs(again - ours)[real].max()),
                  "export_reloaded_vs_original_hf": float(np.abs(again - theirs)[real].max())}))
