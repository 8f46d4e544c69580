#!/usr/bin/env python3
"""transformers' DeepSeek-V4 mHC on the tiny checkpoint (tests/fixtures/deepseek_v4/tiny): layer 0's
attention hyper-connection and the final hyper-head applied to 5 tokens of random streams, and one
residual update, in fp32, for engine/src/forward/mhc.rs to match.

    python3 scripts/deepseek_v4/make_mhc_fixture.py tests/fixtures/deepseek_v4/tiny
"""

import json
import sys
from pathlib import Path

import torch
from transformers import DeepseekV4ForCausalLM


def main(argv=None):
    tiny = Path((argv or sys.argv[1:])[0])
    model = DeepseekV4ForCausalLM.from_pretrained(tiny, dtype=torch.float32).eval()
    config = model.config
    generator = torch.Generator().manual_seed(7)
    streams = torch.randn(1, 5, config.hc_mult, config.hidden_size, generator=generator)
    block_out = torch.randn(1, 5, config.hidden_size, generator=generator)
    layer = model.model.layers[0]
    with torch.no_grad():
        post, comb, collapsed = layer.attn_hc(streams)
        updated = post.unsqueeze(-1) * block_out.unsqueeze(-2) + torch.matmul(comb.transpose(-1, -2), streams)
        head = model.model.hc_head(streams)
    fixture = {
        "made_by": "scripts/deepseek_v4/make_mhc_fixture.py",
        "streams": streams[0].flatten().tolist(),
        "block_out": block_out[0].flatten().tolist(),
        "post": post[0].flatten().tolist(),
        "comb": comb[0].flatten().tolist(),
        "collapsed": collapsed[0].flatten().tolist(),
        "updated": updated[0].flatten().tolist(),
        "head": head[0].flatten().tolist(),
    }
    (tiny / "mhc.json").write_text(json.dumps(fixture))


if __name__ == "__main__":
    sys.exit(main())
