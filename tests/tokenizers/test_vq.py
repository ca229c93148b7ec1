"""The built-in VQ tokenizer: shapes, nearest-code lookup, save/load round trip, shipped quality."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from t2i_gcpo.errors import UserError
from t2i_gcpo.tokenizers.vq import VQConfig, VQTokenizer

from repo_paths import REPO

SHIPPED_VQ = str(REPO / "t2i_gcpo" / "assets" / "shapeworld" / "vq")


def tiny(storage: str = "float32") -> VQTokenizer:
    torch.manual_seed(0)
    return VQTokenizer(
        VQConfig(
            image_size=16, channels=(8, 8), num_down=2, codebook_size=16, code_dim=4, storage_dtype=storage
        )
    ).eval()


def test_encode_decode_shapes_and_ranges():
    vq = tiny()
    x = torch.rand(3, 3, 16, 16)
    ids = vq.encode(x)
    assert vq.grid_shape == (4, 4)
    assert ids.shape == (3, 16) and ids.dtype == torch.long
    assert int(ids.min()) >= 0 and int(ids.max()) < 16
    img = vq.decode(ids)
    assert img.shape == (3, 3, 16, 16)
    assert float(img.min()) >= 0.0 and float(img.max()) <= 1.0
    assert vq.code_embeddings(ids).shape == (3, 16, 4)
    assert torch.equal(vq.code_embeddings(ids)[1, 5], vq.quantizer.embed[ids[1, 5]])


def test_nearest_code_lookup_hand_computed():
    vq = tiny()
    embed = torch.zeros(16, 4)
    embed[1] = torch.tensor([1.0, 0, 0, 0])
    embed[2] = torch.tensor([0, 2.0, 0, 0])
    embed[3] = torch.tensor([-1.0, -1.0, 0, 0])
    vq.quantizer.embed.copy_(embed)
    z = torch.tensor([[0.9, 0.1, 0, 0], [0.2, 1.5, 0, 0], [-0.7, -0.8, 0, 0], [0.1, 0.1, 0, 0]])
    # distances: row 0 nearest code 1, row 1 code 2, row 2 code 3, row 3 the zero codes (first is 0)
    assert vq.quantizer.ids(z).tolist() == [1, 2, 3, 0]


def test_ema_update_moves_used_code_towards_its_encodings():
    vq = tiny()
    q = vq.quantizer
    q.decay = 0.5
    before = q.embed[1].clone()
    z = torch.full((8, 4), 2.0)
    q.ema_update(z, torch.full((8,), 1, dtype=torch.long))
    # embed_avg_1 = 0.5·before + 0.5·(8·2) ; cluster_1 = 0.5·1 + 0.5·8 = 4.5 (before smoothing)
    expected_avg = 0.5 * before + 0.5 * 16.0
    assert torch.allclose(q.embed_avg[1], expected_avg)
    assert q.cluster_size[1].item() == pytest.approx(4.5)
    assert torch.all((q.embed[1] - 2.0).abs() < (before - 2.0).abs())


def test_save_load_round_trip_identical(tmp_path):
    vq = tiny("float32")
    with torch.no_grad():  # make the codebook non-trivial
        vq.quantizer.embed.normal_()
    vq.save_pretrained(str(tmp_path))
    assert {"config.json", "model.safetensors"} <= set(os.listdir(tmp_path))
    back = VQTokenizer.from_pretrained(str(tmp_path))
    x = torch.rand(4, 3, 16, 16)
    assert torch.equal(back.encode(x), vq.encode(x))
    ids = torch.randint(0, 16, (4, 16))
    assert torch.equal(back.decode(ids), vq.decode(ids))


def test_fp16_storage_is_upcast_and_close(tmp_path):
    vq = tiny("float16")
    vq.save_pretrained(str(tmp_path))
    back = VQTokenizer.from_pretrained(str(tmp_path))
    assert all(p.dtype == torch.float32 for p in back.state_dict().values())
    ids = torch.randint(0, 16, (2, 16))
    assert torch.allclose(back.decode(ids), vq.decode(ids), atol=2e-2)


def test_from_pretrained_missing_dir_is_user_error(tmp_path):
    with pytest.raises(UserError, match="not a VQ tokenizer checkpoint"):
        VQTokenizer.from_pretrained(str(tmp_path / "nope"))


def test_shipped_vq_reconstructs_shapeworld_scenes():
    from t2i_gcpo.worlds.shapeworld import generate_metadata, render, sample_scene

    vq = VQTokenizer.from_pretrained(SHIPPED_VQ)
    rng = np.random.default_rng(123)
    imgs = np.stack([render(sample_scene(m, rng)) for m in generate_metadata(32, seed=123)])
    x = torch.from_numpy(imgs).permute(0, 3, 1, 2).float() / 255
    ids = vq.encode(x)
    assert ids.shape == (32, 64)
    mse = torch.mean((vq.decode(ids) - x) ** 2).item()
    assert mse < 0.01  # faithful: a blank gray canvas would score ≈ 0.05 on these scenes
    blank = torch.full_like(x, 153 / 255)
    assert mse < 0.2 * torch.mean((blank - x) ** 2).item()


def test_merge_flat_duplicates_leaves_one_id_per_flat_colour():
    vq = VQTokenizer.from_pretrained(SHIPPED_VQ)
    assert vq.merge_flat_duplicates() == 0  # the shipped tokenizer was merged when the model was built
    k = vq.codebook_size
    patches = vq.code_patches()  # [K, 3, H, W], one code per image
    flat = patches.flatten(1).std(1) < 0.02
    textured = int((~flat).nonzero()[0])
    grey = int(flat.nonzero()[0])
    with torch.no_grad():  # plant near-duplicates: one of a flat code, one of a textured (object) code
        vq.quantizer.embed[k - 1] = vq.quantizer.embed[textured] + 1e-6
        vq.quantizer.embed[k - 2] = vq.quantizer.embed[grey] + 1e-6
    before = vq.code_patches()
    assert vq.merge_flat_duplicates() >= 1
    after = vq.code_patches()
    # merged codes keep their flat colour (within the merge tolerance); the others are unchanged
    assert (before.mean((2, 3)) - after.mean((2, 3))).abs().max() < 0.03
    assert torch.equal(before[~flat], after[~flat])
    emb = vq.quantizer.embed
    colour = after.mean((2, 3))
    groups = {}
    for i in flat.nonzero().flatten().tolist():
        groups.setdefault(tuple(emb[i].tolist()), []).append(i)
    # flat codes of one colour now share one embedding, so encode emits only the group's lowest id
    for i in flat.nonzero().flatten().tolist():
        for j in flat.nonzero().flatten().tolist():
            if i < j and (colour[i] - colour[j]).abs().max() < 0.01:
                assert torch.equal(emb[i], emb[j])
    assert torch.equal(emb[k - 2], emb[grey])
    assert not torch.equal(emb[k - 1], emb[textured])  # object codes are never touched
    from t2i_gcpo.worlds.shapeworld import generate_metadata, render, sample_scene

    rng = np.random.default_rng(0)
    scenes = np.stack([render(sample_scene(m, rng)) for m in generate_metadata(16, seed=0)])
    emitted = set(vq.encode(torch.from_numpy(scenes).permute(0, 3, 1, 2).float() / 255).flatten().tolist())
    unreachable = {i for ids in groups.values() for i in ids if i != min(ids)}
    assert len(unreachable) >= 1 and not emitted & unreachable
    assert vq.merge_flat_duplicates() == 0  # idempotent
