"""The MAGVIT-v2 tokenizer written here (t2i_gcpo/tokenizers/magvitv2.py): its modules carry the released
key names at the released shape and at tiny widths, the lookup-free quantiser's ids and codes, the
attention block against the reference's bmm formulation, decode / encode shapes, save → load, and the
folder's errors."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from t2i_gcpo.errors import UserError
from t2i_gcpo.tokenizers.magvitv2 import AttnBlock, MagvitConfig, MagvitV2

from showo_fixtures import MAGVIT_TINY, build_tiny_magvit, released_magvit_keys

RELEASED = {  # the reference's constructor defaults, as a config.json would spell them
    "ch": 128,
    "encoder_ch_mult": [1, 2, 2, 4, 4],
    "encoder_num_res_blocks": [4, 3, 4, 3, 4],
    "decoder_ch_mult": [1, 1, 2, 2, 4],
    "decoder_num_res_blocks": [4, 4, 3, 4, 3],
    "z_channels": 13,
}


def tiny_config() -> MagvitConfig:
    return MagvitConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in MAGVIT_TINY.items()})


def test_the_released_architecture_has_the_released_key_names_and_size():
    with torch.device("meta"):  # shapes only: 95 M parameters
        model = MagvitV2()
    assert sorted(model.state_dict()) == released_magvit_keys(RELEASED)
    assert model.codebook_size == 8192 and model.config.factor == 16
    n = sum(p.numel() for p in model.state_dict().values())
    assert 380e6 < 4 * n < 384e6, n  # showlab/magvitv2's pytorch_model.safetensors: 382 MB in float32
    assert model.state_dict()["quantize.embedding"].shape == (8192, 13)


def test_lookup_free_quantisation():
    model = MagvitV2(tiny_config())
    table = model.quantize.embedding
    assert table.shape == (16, 4) and set(table.unique().tolist()) == {-1.0, 1.0}
    assert table[0].tolist() == [-1, -1, -1, -1] and table[5].tolist() == [-1, 1, -1, 1]  # 5 = 0b0101
    ids = torch.randint(0, 16, (3, 9))
    z = model.quantize.codes(ids, (3, 3))  # [3, 4, 3, 3]
    assert z.shape == (3, 4, 3, 3) and torch.equal(model.quantize.ids(z), ids)
    latents = torch.randn(2, 4, 2, 2)
    got = model.quantize.ids(latents)
    by_hand = ((latents > 0).long() * torch.tensor([8, 4, 2, 1]).view(1, 4, 1, 1)).sum(1).flatten(1)
    assert torch.equal(got, by_hand)
    assert torch.equal(model.code_embeddings(ids), table[ids])


def test_the_attention_block_is_the_references():
    torch.manual_seed(0)
    block = AttnBlock(32)
    x = torch.randn(2, 32, 3, 5)
    h = block.norm(x)
    q, k, v = block.q(h), block.k(h), block.v(h)
    b, c, hh, ww = q.shape
    w_ = torch.bmm(q.reshape(b, c, hh * ww).permute(0, 2, 1), k.reshape(b, c, hh * ww)) * int(c) ** (-0.5)
    w_ = torch.softmax(w_, dim=2).permute(0, 2, 1)
    ref = x + block.proj_out(torch.bmm(v.reshape(b, c, hh * ww), w_).reshape(b, c, hh, ww))
    torch.testing.assert_close(block(x), ref, atol=1e-5, rtol=1e-5)


def test_decode_encode_shapes_and_a_saved_folder_reads_back(tmp_path):
    folder = build_tiny_magvit(tmp_path / "vq")
    model = MagvitV2.from_pretrained(folder)
    assert not any(p.requires_grad for p in model.parameters())
    ids = torch.randint(0, 16, (2, 16))
    images = model.decode_code(ids)
    assert images.shape == (2, 3, 8, 8) and torch.isfinite(images).all()
    assert model.decode_code(torch.randint(0, 16, (1, 8)), (2, 4)).shape == (1, 3, 4, 8)
    codes = model.get_code(images.clamp(-1, 1))
    assert codes.shape == (2, 16) and codes.dtype == torch.long and int(codes.max()) < 16
    model.save_pretrained(tmp_path / "copy")
    assert json.loads((tmp_path / "copy" / "config.json").read_text()) == json.loads(
        (folder / "config.json").read_text()
    )
    assert torch.equal(MagvitV2.from_pretrained(tmp_path / "copy").decode_code(ids), images)


def test_folder_errors_are_one_line(tmp_path):
    folder = build_tiny_magvit(tmp_path / "vq")

    def broken(name, change):
        dst = tmp_path / name
        shutil.copytree(folder, dst)
        change(dst)
        with pytest.raises(UserError) as e:
            MagvitV2.from_pretrained(dst)
        assert "\n" not in str(e.value)
        return str(e.value)

    def edit(**kw):
        def change(dst):
            cfg = json.loads((dst / "config.json").read_text())
            (dst / "config.json").write_text(json.dumps({**cfg, **kw}))

        return change

    assert "no config.json" in broken("no_cfg", lambda d: (d / "config.json").unlink())
    assert "expected 'MAGVITv2'" in broken("cls", edit(_class_name="VQModel"))
    assert "unknown config key 'codebook_size'" in broken("key", edit(codebook_size=16))
    assert "must be a positive int" in broken("type", edit(ch="wide"))
    assert "has shape" in broken("width", edit(ch=64))
    assert "missing" in broken("levels", edit(decoder_ch_mult=[1, 2, 2], decoder_num_res_blocks=[1, 1, 1]))
    assert "no MAGVIT-v2 weights" in broken("weights", lambda d: (d / "pytorch_model.safetensors").unlink())
