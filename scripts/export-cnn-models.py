#!/usr/bin/env python3
"""Exports CNNs with depthwise convolutions for the CPU benchmarks (random weights, f32).

The architectures are torchvision's (MobileNet-V2 and -V3-Large, EfficientNet-B0, same layers, widths,
strides, activations and residuals) written out in plain PyTorch, so that torchvision is
not needed; weights are random (seeded, torchvision's init), batch-norm statistics are
randomized so that folding them is not an identity. Each model is exported with PyTorch's
dynamo exporter for one input shape.

    .venv-export/bin/python scripts/export-cnn-models.py OUTDIR [mobilenet_v2 efficientnet_b0 ...]

writes OUTDIR/<model>/model.onnx (+ .data) and OUTDIR/<model>/test_data_set_0/{input_0,
output_0}.pb (the input and PyTorch's output, as ONNX test data: `bench/cpu.py --model
NAME=OUTDIR/NAME` reads it). Nothing is downloaded. Keep OUTDIR out of git (the models are
14 and 21 MB).
"""

import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

SEED = 0
SIZE = 224


def divisible(v, d=8):
    n = max(d, int(v + d / 2) // d * d)
    return n + d if n < 0.9 * v else n


def cba(cin, cout, k, s, groups=1, act=nn.ReLU6):
    layers = [nn.Conv2d(cin, cout, k, s, (k - 1) // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act(inplace=True))
    return nn.Sequential(*layers)


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, t):
        super().__init__()
        hid = int(round(cin * t))
        self.res = stride == 1 and cin == cout
        layers = [cba(cin, hid, 1, 1)] if t != 1 else []
        layers += [cba(hid, hid, 3, stride, groups=hid), cba(hid, cout, 1, 1, act=None)]
        self.conv = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.conv(x) if self.res else self.conv(x)


class MobileNetV2(nn.Module):
    """torchvision.models.mobilenet_v2(width_mult=width)."""

    def __init__(self, classes=1000, width=1.0, last=1280):
        super().__init__()
        cin, last = divisible(32 * width), divisible(last * max(1.0, width))
        feats = [cba(3, cin, 3, 2)]
        for t, c, n, s in [[1, 16, 1, 1], [6, 24, 2, 2], [6, 32, 3, 2], [6, 64, 4, 2], [6, 96, 3, 1], [6, 160, 3, 2], [6, 320, 1, 1]]:
            c = divisible(c * width)
            for i in range(n):
                feats.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        feats.append(cba(cin, last, 1, 1))
        self.features = nn.Sequential(*feats)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, classes))

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


class SqueezeExcite(nn.Module):
    def __init__(self, c, sq, act=nn.functional.silu, gate=torch.sigmoid):
        super().__init__()
        self.fc1, self.fc2 = nn.Conv2d(c, sq, 1), nn.Conv2d(sq, c, 1)
        self.act, self.gate = act, gate

    def forward(self, x):
        s = nn.functional.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.fc2(self.act(self.fc1(s))))


class MBConv(nn.Module):
    def __init__(self, t, k, stride, cin, cout):
        super().__init__()
        hid = divisible(cin * t)
        self.res = stride == 1 and cin == cout
        layers = [cba(cin, hid, 1, 1, act=nn.SiLU)] if hid != cin else []
        layers += [cba(hid, hid, k, stride, groups=hid, act=nn.SiLU), SqueezeExcite(hid, max(1, cin // 4)), cba(hid, cout, 1, 1, act=None)]
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.block(x) if self.res else self.block(x)


class EfficientNetB0(nn.Module):
    """torchvision.models.efficientnet_b0() (stochastic depth is the identity in eval), its
    channels scaled by `width`."""

    def __init__(self, classes=1000, width=1.0, last=1280):
        super().__init__()
        w = lambda c: divisible(c * width)  # noqa: E731
        feats = [cba(3, w(32), 3, 2, act=nn.SiLU)]
        for t, k, s, cin, cout, n in [(1, 3, 1, 32, 16, 1), (6, 3, 2, 16, 24, 2), (6, 5, 2, 24, 40, 2), (6, 3, 2, 40, 80, 3),
                                      (6, 5, 1, 80, 112, 3), (6, 5, 2, 112, 192, 4), (6, 3, 1, 192, 320, 1)]:
            for i in range(n):
                feats.append(MBConv(t, k, s if i == 0 else 1, w(cin) if i == 0 else w(cout), w(cout)))
        feats.append(cba(w(320), last, 1, 1, act=nn.SiLU))
        self.features = nn.Sequential(*feats)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, classes))

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


class V3Block(nn.Module):
    """torchvision's MobileNetV3 InvertedResidual: expand, depthwise, optional SE (ReLU,
    hard sigmoid, squeeze to a quarter rounded to 8), project."""

    def __init__(self, cin, k, exp, cout, se, hs, stride):
        super().__init__()
        act = nn.Hardswish if hs else nn.ReLU
        self.res = stride == 1 and cin == cout
        layers = [cba(cin, exp, 1, 1, act=act)] if exp != cin else []
        layers.append(cba(exp, exp, k, stride, groups=exp, act=act))
        if se:
            layers.append(SqueezeExcite(exp, divisible(exp // 4), act=nn.functional.relu, gate=nn.functional.hardsigmoid))
        layers.append(cba(exp, cout, 1, 1, act=None))
        self.block = nn.Sequential(*layers)

    def forward(self, x):
        return x + self.block(x) if self.res else self.block(x)


class MobileNetV3Large(nn.Module):
    """torchvision.models.mobilenet_v3_large(width_mult=width)."""

    SETTINGS = [(3, 16, 16, False, False, 1), (3, 64, 24, False, False, 2), (3, 72, 24, False, False, 1),
                (5, 72, 40, True, False, 2), (5, 120, 40, True, False, 1), (5, 120, 40, True, False, 1),
                (3, 240, 80, False, True, 2), (3, 200, 80, False, True, 1), (3, 184, 80, False, True, 1),
                (3, 184, 80, False, True, 1), (3, 480, 112, True, True, 1), (3, 672, 112, True, True, 1),
                (5, 672, 160, True, True, 2), (5, 960, 160, True, True, 1), (5, 960, 160, True, True, 1)]

    def __init__(self, classes=1000, width=1.0, last=1280):
        super().__init__()
        w = lambda c: divisible(c * width)  # noqa: E731
        cin = w(16)
        feats = [cba(3, cin, 3, 2, act=nn.Hardswish)]
        for k, exp, cout, se, hs, s in self.SETTINGS:
            feats.append(V3Block(cin, k, w(exp), w(cout), se, hs, s))
            cin = w(cout)
        feats.append(cba(cin, 6 * cin, 1, 1, act=nn.Hardswish))
        self.features = nn.Sequential(*feats)
        self.classifier = nn.Sequential(nn.Linear(6 * cin, last), nn.Hardswish(), nn.Dropout(0.2), nn.Linear(last, classes))

    def forward(self, x):
        x = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
        return self.classifier(torch.flatten(x, 1))


MODELS = {"mobilenet_v2": MobileNetV2, "mobilenet_v3": MobileNetV3Large, "efficientnet_b0": EfficientNetB0}


def init(m):
    g = torch.Generator().manual_seed(SEED)
    for mod in m.modules():
        if isinstance(mod, nn.Conv2d):
            nn.init.kaiming_normal_(mod.weight, mode="fan_out", generator=g)
            if mod.bias is not None:
                nn.init.zeros_(mod.bias)
        elif isinstance(mod, nn.BatchNorm2d):
            c = mod.num_features
            mod.weight.data = 0.5 + torch.rand(c, generator=g)
            mod.bias.data = 0.1 * torch.randn(c, generator=g)
            mod.running_mean.data = 0.1 * torch.randn(c, generator=g)
            mod.running_var.data = 0.5 + torch.rand(c, generator=g)
        elif isinstance(mod, nn.Linear):
            nn.init.normal_(mod.weight, 0, 0.01, generator=g)
            nn.init.zeros_(mod.bias)


def save_pb(arr, name, path):
    from onnx import numpy_helper

    path.write_bytes(numpy_helper.from_array(arr, name).SerializeToString())


def main():
    out = Path(sys.argv[1])
    for name in sys.argv[2:] or list(MODELS):
        torch.manual_seed(SEED)
        m = MODELS[name]()
        init(m)
        m.eval()
        x = torch.from_numpy(np.random.default_rng(SEED).standard_normal((1, 3, SIZE, SIZE)).astype(np.float32))
        with torch.no_grad():
            y = m(x).numpy()
        d = out / name
        (d / "test_data_set_0").mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prog = torch.onnx.export(m, (x,), dynamo=True, input_names=["input"], output_names=["output"], optimize=True, verbose=False)
        prog.save(str(d / "model.onnx"), external_data=True)
        save_pb(x.numpy(), "input", d / "test_data_set_0" / "input_0.pb")
        save_pb(y, "output", d / "test_data_set_0" / "output_0.pb")
        np.save(d / "input.npy", x.numpy())
        np.save(d / "expected.npy", y)
        print(f"{name}: {d / 'model.onnx'}  output {y.shape}, |y| max {np.abs(y).max():.3g}", flush=True)


if __name__ == "__main__":
    main()
