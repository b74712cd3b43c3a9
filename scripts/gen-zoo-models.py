#!/usr/bin/env python3
"""Exports the CPU model set ("zoo"): CNNs and transformers with random weights.

Run with the export venv's interpreter (scripts/setup-export-venv.sh):

    .venv-export/bin/python scripts/gen-zoo-models.py [--out target/zoo] [--only convnext,vit]
    .venv-export/bin/python scripts/gen-zoo-models.py --tiny   # models/zoo: the committed variants

Each model is built from its architecture with random, seeded weights (nothing is
downloaded): the CNNs of torchvision written out in plain PyTorch
(`scripts/export-cnn-models.py`; torchvision is not in the export venv), the others from
transformers configs. Batch-norm statistics and norm affines are randomized so that folding
them is not an identity. Every model is exported with PyTorch's dynamo exporter for one
fixed input shape (batch 1), and PyTorch eager's output on a random input is the
reference; onnxruntime's output is checked against it before anything is written.

  mobilenet_v2     MobileNet-V2 (width 1.0), 1x3x224x224
  mobilenet_v3     MobileNet-V3-Large (SE with hard sigmoid, hard swish), 1x3x224x224
  efficientnet_b0  EfficientNet-B0 (SE with SiLU and sigmoid), 1x3x224x224
  convnext         ConvNextForImageClassification, ConvNeXt-T (depths 3-3-9-3, widths
                   96-768), 4x4 stride-4 patch stem, 7x7 depthwise, LayerNorm over channels
  regnet           RegNetForImageClassification, RegNetY-400MF (grouped 3x3 convs of 8
                   channels per group, squeeze-and-excitation), 1x3x224x224
  vit              ViTForImageClassification, 4 layers, hidden 256, 16x16 patches, 224x224
  swin             SwinForImageClassification, Swin-T widths (96, heads 3-6-12-24, window 7)
                   with depths 2-2-2-2, 224x224
  distilbert       DistilBertModel, 6 layers, hidden 768 (distilbert-base), sequence 128
  qwen2            Qwen2ForCausalLM, 4 layers, hidden 512, 8 query / 2 KV heads, vocab 8192,
                   sequence 128
  whisper_encoder  WhisperEncoder, whisper-tiny widths (4 layers, d_model 384), two 1-D
                   convs (k3 s1, k3 s2) over 80 mel bins x 1000 frames
  unet             a small UNet (widths 32-64-128-256, 3x3 conv blocks, 2x2 stride-2
                   ConvTranspose2d decoder, skip concatenations), 1x3x128x128
  dcgan            DCGAN's generator (4x4 ConvTranspose2d: 100 -> 512 from 1x1, then stride 2
                   pad 1 down to 3 channels, batch norm, ReLU, tanh), 64x64 image
  wav2vec2         Wav2Vec2Model, wav2vec2-base's feature encoder (1-D convs k10 s5, k3 s2 x4,
                   k2 s2 x2) at width 256, 2 transformer layers of 256, 16000 samples

and, from torchvision and transformers as they stand (listed with their builders below):
resnext50, regnet_x_400mf, deeplabv3_mnv3, densenet121, googlenet, shufflenet_v2, mnasnet,
resnet18, mobilenet_v3_small, squeezenet, deit, roberta, gpt_neo, mistral; and a third set:
swin_t_tv, regnet_y_400mf, inception_v3, maxvit_t, gpt2, bloom, opt, phi, albert, deberta_v2,
dinov2, mobilevit, segformer, convnextv2, levit; and a fourth: resnet50, swin_v2_t,
regnet_y_800mf, vgg11_bn, electra, mpnet, squeezebert, convbert, mobilebert, gpt_neox, falcon,
gemma, clip_vision, poolformer, cvt, pvt, hubert, resnet_hf.

With --tiny the same architectures are built narrow and small (200-450 KB each, images
32x32 or 64x64, sequences of 16 tokens or 32 frames) into models/zoo, for the tests: by
default only those whose architecture models/ and models/sdpa/ do not already cover
(`TINY`); those files are committed. The full-size models go to a git-ignored folder
(default target/zoo).

Layout per model: <name>/model.onnx (+ model.onnx.data when large), <name>/meta.json
(rtol, atol, versions, parameters, input shapes), <name>/test_data_set_0/{input,output}_<i>.pb
(ONNX test data, read by `bench/cpu.py --zoo DIR` and the tests), and for the full-size
models <name>/input_<i>.npy, <name>/expected_<i>.npy for `tilec run --input/--expect`.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner
import torch
import transformers
from onnx import numpy_helper
from torch import nn

REPO_ROOT = Path(__file__).resolve().parent.parent


def _load(name: str, file: str):
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / file)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


cnn = _load("export_cnn_models", "export-cnn-models.py")
gm = _load("gen_models", "gen-models.py")

SEED = 0


def image(size: int) -> dict:
    return {"pixel_values": ("image", (1, 3, size, size))}


def tokens(seq: int, mask: bool) -> dict:
    d = {"input_ids": ("ids", (1, seq))}
    if mask:
        d["attention_mask"] = ("mask", (1, seq))
    return d


# The variants the tests read (models/zoo): those whose architecture the other committed
# models do not already cover.
TINY = ["mobilenet_v3", "efficientnet_b0", "convnext", "regnet", "swin", "whisper_encoder"]


# Each builder takes `tiny` and returns (module, inputs {name: (kind, shape)}, output names).
def build_mobilenet_v2(tiny):
    m = cnn.MobileNetV2(classes=10, width=0.125, last=32) if tiny else cnn.MobileNetV2()
    return m, image(32 if tiny else 224), ["logits"]


def build_mobilenet_v3(tiny):
    m = cnn.MobileNetV3Large(classes=10, width=0.125, last=32) if tiny else cnn.MobileNetV3Large()
    return m, image(32 if tiny else 224), ["logits"]


def build_efficientnet_b0(tiny):
    m = cnn.EfficientNetB0(classes=10, width=0.125, last=32) if tiny else cnn.EfficientNetB0()
    return m, image(32 if tiny else 224), ["logits"]


def build_convnext(tiny):
    if tiny:
        c = transformers.ConvNextConfig(hidden_sizes=[16, 24, 32, 48], depths=[1, 1, 2, 1], num_labels=10, image_size=64)
    else:
        c = transformers.ConvNextConfig(hidden_sizes=[96, 192, 384, 768], depths=[3, 3, 9, 3], num_labels=1000)
    c.layer_scale_init_value = 0.5  # not 1e-6: the residual branches must matter
    return transformers.ConvNextForImageClassification(c), image(64 if tiny else 224), ["logits"]


def build_regnet(tiny):
    if tiny:
        c = transformers.RegNetConfig(embedding_size=16, hidden_sizes=[16, 24, 48, 64], depths=[1, 1, 2, 1],
                                      groups_width=8, layer_type="y", num_labels=10)
    else:
        c = transformers.RegNetConfig(embedding_size=32, hidden_sizes=[48, 104, 208, 440], depths=[1, 3, 6, 6],
                                      groups_width=8, layer_type="y", num_labels=1000)
    return transformers.RegNetForImageClassification(c), image(64 if tiny else 224), ["logits"]


def build_vit(tiny):
    if tiny:
        c = transformers.ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                                   image_size=32, patch_size=8, num_labels=10)
    else:
        c = transformers.ViTConfig(hidden_size=256, num_hidden_layers=4, num_attention_heads=8, intermediate_size=1024,
                                   image_size=224, patch_size=16, num_labels=1000)
    return transformers.ViTForImageClassification(c), image(c.image_size), ["logits"]


def build_swin(tiny):
    if tiny:
        c = transformers.SwinConfig(image_size=64, patch_size=4, embed_dim=16, depths=[2, 2], num_heads=[2, 4],
                                    window_size=4, num_labels=10)
    else:
        c = transformers.SwinConfig(image_size=224, patch_size=4, embed_dim=96, depths=[2, 2, 2, 2],
                                    num_heads=[3, 6, 12, 24], window_size=7, num_labels=1000)
    # The SDPA path reshapes a transposed output with `view`, which the exporter refuses.
    c._attn_implementation = "eager"
    return transformers.SwinForImageClassification(c), image(c.image_size), ["logits"]


def build_distilbert(tiny):
    if tiny:
        c = transformers.DistilBertConfig(vocab_size=256, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                                          max_position_embeddings=64)
    else:
        c = transformers.DistilBertConfig(vocab_size=8192)
    return transformers.DistilBertModel(c), tokens(16 if tiny else 128, True), ["last_hidden_state"]


def build_qwen2(tiny):
    if tiny:
        c = transformers.Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                     use_cache=False, tie_word_embeddings=True)
    else:
        c = transformers.Qwen2Config(vocab_size=8192, hidden_size=512, intermediate_size=1536, num_hidden_layers=4,
                                     num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=512,
                                     use_cache=False, tie_word_embeddings=True)
    return transformers.Qwen2ForCausalLM(c), tokens(16 if tiny else 128, False), ["logits"]


class WhisperEncoder(nn.Module):
    """transformers' WhisperEncoder returning its last hidden state alone."""

    def __init__(self, c):
        super().__init__()
        self.enc = transformers.models.whisper.modeling_whisper.WhisperEncoder(c)

    def forward(self, input_features):
        return self.enc(input_features).last_hidden_state


def build_whisper_encoder(tiny):
    if tiny:
        c = transformers.WhisperConfig(num_mel_bins=16, d_model=64, encoder_layers=2, encoder_attention_heads=4,
                                       encoder_ffn_dim=128, max_source_positions=16)
    else:
        c = transformers.WhisperConfig(num_mel_bins=80, d_model=384, encoder_layers=4, encoder_attention_heads=6,
                                       encoder_ffn_dim=1536, max_source_positions=500)
    frames = 2 * c.max_source_positions
    return WhisperEncoder(c), {"input_features": ("image", (1, c.num_mel_bins, frames))}, ["last_hidden_state"]


# ---- transposed and 1-D convolutions (UNet / DCGAN decoders, wav2vec2's feature encoder) ----


class UNet(nn.Module):
    """A small UNet: double 3x3 conv blocks (batch norm, ReLU), max-pool down, 2x2 stride-2
    transposed convolutions up, skip concatenations, a 1x1 head."""

    def __init__(self, widths, classes=2):
        super().__init__()

        def block(i, o):
            return nn.Sequential(nn.Conv2d(i, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU(),
                                 nn.Conv2d(o, o, 3, padding=1, bias=False), nn.BatchNorm2d(o), nn.ReLU())

        self.down = nn.ModuleList()
        c = 3
        for w in widths:
            self.down.append(block(c, w))
            c = w
        self.up = nn.ModuleList()
        self.dec = nn.ModuleList()
        for w in reversed(widths[:-1]):
            self.up.append(nn.ConvTranspose2d(c, w, 2, stride=2))
            self.dec.append(block(2 * w, w))
            c = w
        self.head = nn.Conv2d(c, classes, 1)

    def forward(self, x):
        skips = []
        for i, b in enumerate(self.down):
            if i:
                x = nn.functional.max_pool2d(x, 2)
            x = b(x)
            skips.append(x)
        for up, dec, s in zip(self.up, self.dec, reversed(skips[:-1])):
            x = dec(torch.cat([up(x), s], 1))
        return self.head(x)


def build_unet(tiny):
    widths = [8, 16, 32] if tiny else [32, 64, 128, 256]
    return UNet(widths), image(32 if tiny else 128), ["logits"]


class DCGANGenerator(nn.Module):
    """DCGAN's generator: a latent vector through 4x4 transposed convolutions (stride 1 from
    1x1, then stride 2 with padding 1), batch norm and ReLU, tanh on the image."""

    def __init__(self, nz, ngf):
        super().__init__()
        chans = [nz, 8 * ngf, 4 * ngf, 2 * ngf, ngf]
        layers = []
        for i, (a, b) in enumerate(zip(chans, chans[1:])):
            layers += [nn.ConvTranspose2d(a, b, 4, 1 if i == 0 else 2, 0 if i == 0 else 1, bias=False),
                       nn.BatchNorm2d(b), nn.ReLU()]
        layers += [nn.ConvTranspose2d(ngf, 3, 4, 2, 1, bias=False), nn.Tanh()]
        self.net = nn.Sequential(*layers)

    def forward(self, z):
        return self.net(z)


def build_dcgan(tiny):
    nz, ngf = (16, 8) if tiny else (100, 64)
    return DCGANGenerator(nz, ngf), {"z": ("image", (1, nz, 1, 1))}, ["image"]


class Wav2Vec2(nn.Module):
    """transformers' Wav2Vec2Model returning its last hidden state alone."""

    def __init__(self, c):
        super().__init__()
        self.m = transformers.Wav2Vec2Model(c)

    def forward(self, input_values):
        return self.m(input_values).last_hidden_state


def build_wav2vec2(tiny):
    # wav2vec2-base's feature encoder (kernels 10-3-3-3-3-2-2, strides 5-2-2-2-2-2-2, group
    # norm after the first conv) at a narrower width, and a short transformer.
    if tiny:
        c = transformers.Wav2Vec2Config(conv_dim=(16,) * 7, hidden_size=32, num_hidden_layers=1,
                                        num_attention_heads=2, intermediate_size=64, num_conv_pos_embeddings=8,
                                        num_conv_pos_embedding_groups=4)
        samples = 1600
    else:
        c = transformers.Wav2Vec2Config(conv_dim=(256,) * 7, hidden_size=256, num_hidden_layers=2,
                                        num_attention_heads=4, intermediate_size=1024, num_conv_pos_embeddings=32,
                                        num_conv_pos_embedding_groups=16)
        samples = 16000
    c.apply_spec_augment = False
    c._attn_implementation = "eager"
    return Wav2Vec2(c), {"input_values": ("image", (1, samples))}, ["last_hidden_state"]


CONV_TRANSPOSE_MODELS = {"unet": build_unet, "dcgan": build_dcgan, "wav2vec2": build_wav2vec2}

# ---- end of transposed and 1-D convolutions ----


MODELS = {
    "mobilenet_v2": build_mobilenet_v2,
    "mobilenet_v3": build_mobilenet_v3,
    "efficientnet_b0": build_efficientnet_b0,
    "convnext": build_convnext,
    "regnet": build_regnet,
    "vit": build_vit,
    "swin": build_swin,
    "distilbert": build_distilbert,
    "qwen2": build_qwen2,
    "whisper_encoder": build_whisper_encoder,
    **CONV_TRANSPOSE_MODELS,
}


# --- Grouped and dilated convolutions (torchvision architectures, random weights) ---------
#
#   resnext50       torchvision resnext50_32x4d: grouped 3x3 convs, 32 groups of 4 to 32
#                   channels, 1x3x224x224
#   regnet_x_400mf  torchvision regnet_x_400mf: grouped 3x3 convs of 16 channels per group,
#                   no squeeze-and-excitation, 1x3x224x224
#   deeplabv3_mnv3  torchvision deeplabv3_mobilenet_v3_large: a MobileNet-V3 backbone whose
#                   last stage is dilated (depthwise 3x3/5x5 at dilation 2), an ASPP head of
#                   3x3 convs at dilation 12/24/36, bilinear upsampling; 1x3x224x224
#
# torchvision is imported here only (with no pretrained weights of any kind).


class SegmentationOut(nn.Module):
    """A torchvision segmentation model returning its "out" tensor alone."""

    def __init__(self, m):
        super().__init__()
        self.m = m

    def forward(self, x):
        return self.m(x)["out"]


def build_resnext50(tiny):
    import torchvision
    m = torchvision.models.resnext50_32x4d(weights=None, num_classes=10 if tiny else 1000)
    return m, {"x": ("image", (1, 3, 64 if tiny else 224, 64 if tiny else 224))}, ["logits"]


def build_regnet_x_400mf(tiny):
    import torchvision
    m = torchvision.models.regnet_x_400mf(weights=None, num_classes=10 if tiny else 1000)
    return m, {"x": ("image", (1, 3, 64 if tiny else 224, 64 if tiny else 224))}, ["logits"]


def build_deeplabv3_mnv3(tiny):
    import torchvision
    m = torchvision.models.segmentation.deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None,
                                                                     num_classes=21, aux_loss=False)
    return SegmentationOut(m), {"x": ("image", (1, 3, 64 if tiny else 224, 64 if tiny else 224))}, ["out"]


# Absolute tolerances of these models, as a fraction of their largest output (default 1e-4):
# the segmentation head sums 21 channels of 224x224 logits in the thousands after a deep
# random stack, and onnxruntime and torch differ by up to 3e-4 of the largest.
ATOL_FRACTION = {"deeplabv3_mnv3": 1e-3}

GROUPED_DILATED = {
    "resnext50": build_resnext50,
    "regnet_x_400mf": build_regnet_x_400mf,
    "deeplabv3_mnv3": build_deeplabv3_mnv3,
}
# --- end of grouped and dilated convolutions ---------------------------------------------

MODELS.update(GROUPED_DILATED)


# --- more architectures, as users export them (full size only) ----------------------------
#   densenet121        torchvision densenet121: dense blocks concatenating up to 48 layers'
#                      features, batch norm and ReLU before each 1x1 conv; 1x3x224x224
#   googlenet          torchvision googlenet (no auxiliary heads): inception concatenations
#   shufflenet_v2      torchvision shufflenet_v2_x1_0: channel split, shuffle (reshape,
#                      transpose), depthwise 3x3
#   mnasnet            torchvision mnasnet1_0; resnet18; mobilenet_v3_small; squeezenet1_1
#   deit               DeiTForImageClassification, DeiT-Tiny widths (192, 12 layers, 3 heads)
#   roberta            RobertaModel, 4 layers of roberta-base width, vocab 8192, sequence 128
#   gpt_neo            GPTNeoModel, 4 layers of 512 (global and local attention), sequence 128
#   mistral            MistralForCausalLM, 4 layers of 512, 8 query / 2 KV heads, vocab 8192


def torchvision_model(name: str, **kw):
    def build(tiny):
        import torchvision
        m = getattr(torchvision.models, name)(weights=None, **kw)
        return m, {"x": ("image", (1, 3, 224, 224))}, ["logits"]
    return build


def hf_model(config: str, model: str, inputs: dict, output: str, **kw):
    def build(tiny):
        return getattr(transformers, model)(getattr(transformers, config)(**kw)), inputs, [output]
    return build


MORE = {
    "densenet121": torchvision_model("densenet121"),
    "googlenet": torchvision_model("googlenet", aux_logits=False, init_weights=False),
    "shufflenet_v2": torchvision_model("shufflenet_v2_x1_0"),
    "mnasnet": torchvision_model("mnasnet1_0"),
    "resnet18": torchvision_model("resnet18"),
    "mobilenet_v3_small": torchvision_model("mobilenet_v3_small"),
    "squeezenet": torchvision_model("squeezenet1_1"),
    "deit": hf_model("DeiTConfig", "DeiTForImageClassification", image(224), "logits", hidden_size=192,
                     num_hidden_layers=12, num_attention_heads=3, intermediate_size=768),
    "roberta": hf_model("RobertaConfig", "RobertaModel", tokens(128, True), "last_hidden_state", vocab_size=8192,
                        num_hidden_layers=4),
    "gpt_neo": hf_model("GPTNeoConfig", "GPTNeoModel", tokens(128, False), "last_hidden_state", vocab_size=8192,
                        hidden_size=512, num_layers=4, num_heads=8, attention_types=[[["global", "local"], 2]],
                        use_cache=False),
    "mistral": hf_model("MistralConfig", "MistralForCausalLM", tokens(128, False), "logits", vocab_size=8192,
                        hidden_size=512, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8,
                        num_key_value_heads=2, use_cache=False),
}
MODELS.update(MORE)


# --- a third set (full size only): attention and convolution forms not covered above -------
#   swin_t_tv          torchvision swin_t (its own shifted windows and relative position bias)
#   regnet_y_400mf     torchvision: grouped convolutions with squeeze-and-excitation
#   inception_v3       torchvision (no auxiliary head), asymmetric 1x7 / 7x1 convolutions
#   maxvit_t           torchvision: MBConv, block and grid attention with relative bias
#   gpt2               GPT2Model, 4 layers of 512 (SDPA attention, Conv1D projections)
#   bloom              BloomModel, 4 layers of 512 (ALiBi biases; no attention mask: the
#                      model's second positional input is the cache)
#   opt                OPTModel, 4 layers of 512
#   phi                PhiModel, 4 layers of 512 (partial rotary embedding)
#   albert             AlbertModel, 4 layers of 768 sharing weights
#   deberta_v2         DebertaV2Model, 4 layers of 384 (disentangled relative attention)
#   dinov2             Dinov2Model, 6 layers of 384, position embeddings interpolated
#                      (bicubic) from the default 518 to 224
#   mobilevit          MobileViTForImageClassification (default config), 256 x 256
#   segformer          SegformerForSemanticSegmentation (default config, b0 widths)
#   convnextv2         ConvNextV2ForImageClassification (default config: tiny widths, GRN)
#   levit              LevitForImageClassification (default config: 128S)
# (T5's encoder and BEiT at these transformers and torch versions fail in the exporter itself:
# a view of a transposed attention output.)
THIRD = {
    "swin_t_tv": torchvision_model("swin_t"),
    "regnet_y_400mf": torchvision_model("regnet_y_400mf"),
    "inception_v3": torchvision_model("inception_v3", aux_logits=False, init_weights=False),
    "maxvit_t": torchvision_model("maxvit_t"),
    "gpt2": hf_model("GPT2Config", "GPT2Model", tokens(128, False), "last_hidden_state", vocab_size=8192,
                     n_layer=4, n_embd=512, n_head=8, use_cache=False),
    "bloom": hf_model("BloomConfig", "BloomModel", tokens(128, False), "last_hidden_state", vocab_size=8192,
                      hidden_size=512, n_layer=4, n_head=8, use_cache=False),
    "opt": hf_model("OPTConfig", "OPTModel", tokens(128, True), "last_hidden_state", vocab_size=8192,
                    hidden_size=512, ffn_dim=2048, num_hidden_layers=4, num_attention_heads=8,
                    word_embed_proj_dim=512, use_cache=False),
    "phi": hf_model("PhiConfig", "PhiModel", tokens(128, False), "last_hidden_state", vocab_size=8192,
                    hidden_size=512, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=8,
                    partial_rotary_factor=0.5, use_cache=False),
    "albert": hf_model("AlbertConfig", "AlbertModel", tokens(128, True), "last_hidden_state", vocab_size=8192,
                       hidden_size=768, num_attention_heads=12, intermediate_size=3072, num_hidden_layers=4),
    "deberta_v2": hf_model("DebertaV2Config", "DebertaV2Model", tokens(128, True), "last_hidden_state",
                           vocab_size=8192, hidden_size=384, num_hidden_layers=4, num_attention_heads=6,
                           intermediate_size=1536),
    "dinov2": hf_model("Dinov2Config", "Dinov2Model", image(224), "last_hidden_state", hidden_size=384,
                       num_hidden_layers=6, num_attention_heads=6),
    "mobilevit": hf_model("MobileViTConfig", "MobileViTForImageClassification", image(256), "logits"),
    "segformer": hf_model("SegformerConfig", "SegformerForSemanticSegmentation", image(224), "logits"),
    "convnextv2": hf_model("ConvNextV2Config", "ConvNextV2ForImageClassification", image(224), "logits"),
    "levit": hf_model("LevitConfig", "LevitForImageClassification", image(224), "logits"),
}
MODELS.update(THIRD)


def audio(samples: int) -> dict:
    """A waveform of standard normal samples (drawn as an image's pixels are)."""
    return {"input_values": ("image", (1, samples))}


# --- a fourth set (full size only): more of what users export -------------------------------
#   resnet50, swin_v2_t, regnet_y_800mf, vgg11_bn   torchvision
#   electra, mpnet, squeezebert, convbert, mobilebert   BERT-like encoders at 128 tokens
#                      (SqueezeBERT: grouped 1-D convolutions in channels-first layout with
#                      LayerNorms between transposes; ConvBERT: span-based dynamic
#                      convolutions; MobileBERT: bottlenecks, no-norm layers, 8 layers)
#   gpt_neox, falcon, gemma   decoders, 4 layers of 512
#   clip_vision        CLIPVisionModel, 6 layers (quick GELU, 50 tokens)
#   poolformer, cvt, pvt, resnet_hf   transformers' vision models (default configs)
#   hubert             HubertModel, 4 layers, 16000 samples
# (EfficientNet-V2-S's random weights overflow: PyTorch's and onnxruntime's outputs of order
# 1e10 differ; EfficientFormer is gone from transformers.)
_T = dict(vocab_size=8192)
FOURTH = {
    "resnet50": torchvision_model("resnet50"),
    "swin_v2_t": torchvision_model("swin_v2_t"),
    "regnet_y_800mf": torchvision_model("regnet_y_800mf"),
    "vgg11_bn": torchvision_model("vgg11_bn"),
    "electra": hf_model("ElectraConfig", "ElectraModel", tokens(128, True), "last_hidden_state", **_T,
                        num_hidden_layers=4),
    "mpnet": hf_model("MPNetConfig", "MPNetModel", tokens(128, True), "last_hidden_state", **_T, num_hidden_layers=4),
    "squeezebert": hf_model("SqueezeBertConfig", "SqueezeBertModel", tokens(128, True), "last_hidden_state", **_T,
                            num_hidden_layers=4),
    "convbert": hf_model("ConvBertConfig", "ConvBertModel", tokens(128, True), "last_hidden_state", **_T,
                         num_hidden_layers=4),
    "mobilebert": hf_model("MobileBertConfig", "MobileBertModel", tokens(128, True), "last_hidden_state", **_T,
                           num_hidden_layers=8),
    "gpt_neox": hf_model("GPTNeoXConfig", "GPTNeoXModel", tokens(128, False), "last_hidden_state", **_T,
                         hidden_size=512, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=8,
                         use_cache=False),
    "falcon": hf_model("FalconConfig", "FalconModel", tokens(128, False), "last_hidden_state", **_T,
                       hidden_size=512, num_hidden_layers=4, num_attention_heads=8, use_cache=False),
    "gemma": hf_model("GemmaConfig", "GemmaModel", tokens(128, False), "last_hidden_state", **_T,
                      hidden_size=512, intermediate_size=2048, num_hidden_layers=4, num_attention_heads=8,
                      num_key_value_heads=2, head_dim=64, use_cache=False),
    "clip_vision": hf_model("CLIPVisionConfig", "CLIPVisionModel", image(224), "last_hidden_state",
                            num_hidden_layers=6),
    "poolformer": hf_model("PoolFormerConfig", "PoolFormerForImageClassification", image(224), "logits"),
    "cvt": hf_model("CvtConfig", "CvtForImageClassification", image(224), "logits"),
    "pvt": hf_model("PvtConfig", "PvtForImageClassification", image(224), "logits"),
    "hubert": hf_model("HubertConfig", "HubertModel", audio(16000), "last_hidden_state", num_hidden_layers=4),
    "resnet_hf": hf_model("ResNetConfig", "ResNetForImageClassification", image(224), "logits"),
}
MODELS.update(FOURTH)


# --- a fifth set (full size only) -------------------------------------------------------------
#   vit_b_16, wide_resnet50_2, efficientnet_b3, alexnet   torchvision (vit_b_16: nn.MultiheadAttention)
#   r3d_18, r2plus1d_18, mc3_18   torchvision video models: 3-D convolutions over 8 frames of
#                      112x112
#   s3d                torchvision's S3D (separable 3-D convolutions, 3-D max pools, inception
#                      branches) over 16 frames of 224x224
#   mvit_v2_s, swin3d_t   torchvision's video transformers over 16 frames of 224x224 (MViT-v2:
#                      pooled attention through 3-D convolutions; Swin3D: 3-D shifted windows)
#   gptj, codegen, stablelm, phi3, qwen3, gemma2   decoders, 4 layers of 512
#                      (GPT-J and CodeGen: interleaved partial rotary; StableLM: partial rotary
#                      and LayerNorm; Qwen3: q/k norms; Gemma-2: logit softcapping and a sliding
#                      window)
#   modernbert, bart, funnel   encoders (and BART's decoder) at 128 tokens (Funnel: relative
#                      attention with sinusoidal tables, pooling between blocks)
#   focalnet, bit, siglip_vision, mobilevitv2, hiera, swin2sr   vision (default configs;
#                      BiT: weight-standardized convolutions; SigLIP 6 layers; MobileViT-v2:
#                      unfold/fold; Swin2SR: super-resolution of 64x64 with a pixel shuffle)
#   ast, wavlm         audio: a spectrogram transformer (4 layers) and WavLM (4 layers)
# (Not exportable with this exporter and transformers: Mixtral, whose experts run as a custom
# grouped product, or as a data-dependent loop with the eager experts; T5's and BEiT's
# attention, whose output view of a transposed tensor fails in the exporter's decomposition.)
def video_model(name: str, frames: int = 8, size: int = 112):
    def build(tiny):
        import torchvision
        m = getattr(torchvision.models.video, name)(weights=None)
        return m, {"x": ("image", (1, 3, frames, size, size))}, ["logits"]
    return build


_D = dict(vocab_size=8192, use_cache=False, pad_token_id=0)
_L = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=4, num_attention_heads=8)
FIFTH = {
    "vit_b_16": torchvision_model("vit_b_16"),
    "wide_resnet50_2": torchvision_model("wide_resnet50_2"),
    "efficientnet_b3": torchvision_model("efficientnet_b3"),
    "alexnet": torchvision_model("alexnet"),
    "r3d_18": video_model("r3d_18"),
    "r2plus1d_18": video_model("r2plus1d_18"),
    "mc3_18": video_model("mc3_18"),
    "s3d": video_model("s3d", frames=16, size=224),
    "mvit_v2_s": video_model("mvit_v2_s", frames=16, size=224),
    "swin3d_t": video_model("swin3d_t", frames=16, size=224),
    "gptj": hf_model("GPTJConfig", "GPTJModel", tokens(128, False), "last_hidden_state", **_D, n_embd=512,
                     n_layer=4, n_head=8, rotary_dim=32),
    "codegen": hf_model("CodeGenConfig", "CodeGenModel", tokens(128, False), "last_hidden_state", **_D, n_embd=512,
                        n_layer=4, n_head=8, rotary_dim=32),
    "stablelm": hf_model("StableLmConfig", "StableLmModel", tokens(128, False), "last_hidden_state", **_D, **_L,
                         num_key_value_heads=8, partial_rotary_factor=0.25),
    "phi3": hf_model("Phi3Config", "Phi3Model", tokens(128, False), "last_hidden_state", **_D, **_L,
                     num_key_value_heads=4),
    "qwen3": hf_model("Qwen3Config", "Qwen3Model", tokens(128, False), "last_hidden_state", **_D, **_L,
                      num_key_value_heads=2, head_dim=64),
    "gemma2": hf_model("Gemma2Config", "Gemma2Model", tokens(128, False), "last_hidden_state", **_D, **_L,
                       num_key_value_heads=2, head_dim=64, sliding_window=64),
    "modernbert": hf_model("ModernBertConfig", "ModernBertModel", tokens(128, True), "last_hidden_state",
                           vocab_size=8192, pad_token_id=0, hidden_size=256, intermediate_size=384,
                           num_hidden_layers=4, num_attention_heads=4, local_attention=64),
    "bart": hf_model("BartConfig", "BartModel", tokens(128, True), "last_hidden_state", vocab_size=8192, d_model=512,
                     encoder_layers=3, decoder_layers=3, encoder_attention_heads=8, decoder_attention_heads=8,
                     encoder_ffn_dim=2048, decoder_ffn_dim=2048, use_cache=False),
    "funnel": hf_model("FunnelConfig", "FunnelBaseModel", tokens(128, True), "last_hidden_state", vocab_size=8192,
                       block_sizes=[2, 2, 2]),
    "focalnet": hf_model("FocalNetConfig", "FocalNetForImageClassification", image(224), "logits"),
    "bit": hf_model("BitConfig", "BitForImageClassification", image(224), "logits"),
    "siglip_vision": hf_model("SiglipVisionConfig", "SiglipVisionModel", image(224), "last_hidden_state",
                              num_hidden_layers=6),
    "mobilevitv2": hf_model("MobileViTV2Config", "MobileViTV2ForImageClassification", image(256), "logits"),
    "hiera": hf_model("HieraConfig", "HieraModel", image(224), "last_hidden_state"),
    "swin2sr": hf_model("Swin2SRConfig", "Swin2SRForImageSuperResolution", image(64), "reconstruction"),
    "ast": hf_model("ASTConfig", "ASTForAudioClassification", {"input_values": ("image", (1, 1024, 128))}, "logits",
                    num_hidden_layers=4),
    "wavlm": hf_model("WavLMConfig", "WavLMModel", audio(16000), "last_hidden_state", num_hidden_layers=4),
}
MODELS.update(FIFTH)
# BiT's weight-standardized convolutions: PyTorch and onnxruntime differ by about 5e-4.
ATOL_FRACTION["bit"] = 1e-3


def randomize(m: nn.Module) -> None:
    """Convolutions get He-normal weights (the stacks stay O(1) deep down), batch norms
    random statistics and affines, and every other 1-D parameter (biases, LayerNorm
    scales, layer scales) random values, so that no folding is an identity and no two
    per-channel vectors are equal."""
    g = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d)):
                nn.init.kaiming_normal_(mod.weight, mode="fan_in", generator=g)
            elif isinstance(mod, nn.Linear) and not bool(mod.weight.any()):
                # Zero-initialized heads (torchvision's ViT) would make the output a constant.
                nn.init.normal_(mod.weight, std=mod.in_features ** -0.5, generator=g)
            elif isinstance(mod, (nn.BatchNorm2d, nn.BatchNorm3d)):
                c = mod.num_features
                mod.running_mean.copy_(0.1 * torch.randn(c, generator=g))
                mod.running_var.copy_(0.5 + torch.rand(c, generator=g))
        for name, p in m.named_parameters():
            if p.dim() != 1:
                continue
            if name.endswith("bias"):
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.75 + 0.5 * torch.rand(p.shape, generator=g))


def make_input(kind: str, shape, rng, vocab: int) -> np.ndarray:
    if kind == "image":
        return rng.standard_normal(shape).astype(np.float32)
    if kind == "ids":
        return rng.integers(0, vocab, size=shape, dtype=np.int64)
    mask = np.ones(shape, dtype=np.int64)
    mask[..., shape[-1] - shape[-1] // 4:] = 0  # trailing quarter is padding
    return mask


def save_pb(arr: np.ndarray, name: str, path: Path) -> None:
    path.write_bytes(numpy_helper.from_array(arr, name).SerializeToString())


def gen(name: str, out: Path, tiny: bool, npy: bool) -> None:
    torch.manual_seed(SEED)
    module, spec, output_names = MODELS[name](tiny)
    randomize(module)
    module.eval()
    cfg = getattr(module, "config", None)
    if cfg is not None:
        cfg.return_dict = True
    vocab = getattr(cfg, "vocab_size", 2)
    rng = np.random.default_rng(SEED)
    inputs = {n: make_input(k, s, rng, vocab) for n, (k, s) in spec.items()}
    example = tuple(torch.from_numpy(v) for v in inputs.values())
    with torch.no_grad():
        res = module(*example)
    outs = [res] if isinstance(res, torch.Tensor) else [res[n] for n in output_names]
    expected = [o.detach().numpy().astype(np.float32) for o in outs]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prog = torch.onnx.export(module, example, dynamo=True, input_names=list(inputs), output_names=output_names,
                                 optimize=True, verbose=False)
    model = prog.model_proto
    if len(model.functions):
        model = onnx.inliner.inline_local_functions(model)
        del model.functions[:]
    gm.strip_metadata(model)

    d = out / name
    if d.exists():
        shutil.rmtree(d)
    (d / "test_data_set_0").mkdir(parents=True)
    path = d / "model.onnx"
    large = model.ByteSize() > 20 << 20
    onnx.save_model(model, path, save_as_external_data=large, location="model.onnx.data" if large else None)
    onnx.checker.check_model(str(path), full_check=True)

    params = sum(p.numel() for p in module.parameters())
    # Outputs far larger than 1 get an absolute tolerance in proportion.
    rtol = 1e-3
    atol = ATOL_FRACTION.get(name, 1e-4) * max(1.0, max(float(np.max(np.abs(e))) for e in expected))
    got = gm.ort_run(path, inputs)
    for n, g, e in zip(output_names, got, expected):
        err = float(np.max(np.abs(g - e)))
        ok = g.shape == e.shape and bool(np.allclose(g, e, rtol=rtol, atol=atol))
        print(f"[{name}] onnxruntime vs torch eager {n}: max|diff| {err:.3e} (atol {atol:.3g}) ok={ok}", flush=True)
        if not ok:
            raise SystemExit(f"[{name}] onnxruntime output differs from torch eager")

    for i, (n, v) in enumerate(inputs.items()):
        save_pb(v, n, d / "test_data_set_0" / f"input_{i}.pb")
        if npy:
            np.save(d / f"input_{i}.npy", v)
    for i, (n, v) in enumerate(zip(output_names, expected)):
        save_pb(v, n, d / "test_data_set_0" / f"output_{i}.pb")
        if npy:
            np.save(d / f"expected_{i}.npy", v)
    meta = {
        "rtol": rtol,
        "atol": atol,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "params": params,
        "inputs": {n: list(v.shape) for n, v in inputs.items()},
        "outputs": output_names,
    }
    (d / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    size = sum(f.stat().st_size for f in d.glob("model.onnx*"))
    print(f"[{name}] {params} parameters, {size / 1e6:.2f} MB, inputs {meta['inputs']}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="output folder (default target/zoo, or models/zoo with --tiny)")
    ap.add_argument("--only", help="comma-separated model names (default all; with --tiny those the tests read)")
    ap.add_argument("--tiny", action="store_true", help="the narrow, small variants the tests use")
    args = ap.parse_args()
    out = args.out or REPO_ROOT / ("models/zoo" if args.tiny else "target/zoo")
    torch.set_num_threads(2)
    transformers.logging.set_verbosity_error()
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    names = [n for n in args.only.split(",") if n] if args.only else (TINY if args.tiny else list(MODELS))
    for n in names:
        if n not in MODELS:
            ap.error(f"unknown model {n!r}; known: {', '.join(MODELS)}")
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    for n in names:
        try:
            gen(n, out, args.tiny, npy=not args.tiny)
        except Exception as e:  # noqa: BLE001 - report and go on with the others
            print(f"[{n}] FAILED: {type(e).__name__}: {e}", flush=True)
            failed.append(n)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
