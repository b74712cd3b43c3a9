"""torch.compile(model, backend="tilec"): CNNs and a GPT-2-style transformer matched to eager,
dynamic sizes, graph breaks, fallbacks and options. Skipped, with the reason, without PyTorch
(scripts/test-python.sh installs it)."""

import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed (scripts/setup-export-venv.sh)")
nn = torch.nn

import tilec  # noqa: E402
import tilec.dynamo  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def compiled_by_tilec(fn, *calls, options=None, atol=1e-4, rtol=1e-4):
    """Runs `fn` eagerly and through torch.compile(backend="tilec") on each call's arguments
    under no_grad; checks the outputs match and no graph fell back. Returns the compiled fn."""
    before = dict(tilec.dynamo.stats)
    c = torch.compile(fn, backend="tilec", options=options)
    with torch.no_grad(), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for args in calls:
            want = fn(*args)
            got = c(*args)
            torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
    msgs = [str(m.message) for m in w if "tilec" in str(m.message)]
    assert msgs == []
    assert tilec.dynamo.stats["eager"] == before["eager"]
    assert tilec.dynamo.stats["compiled"] > before["compiled"]
    return c


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class TinyResNet(nn.Module):
    """torchvision's ResNet layout (stem, basic blocks, pooling, classifier), scaled down."""

    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 7, 2, 3, bias=False), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(3, 2, 1))
        self.layers = nn.Sequential(BasicBlock(16, 16, 1), BasicBlock(16, 32, 2), BasicBlock(32, 64, 2))
        self.fc = nn.Linear(64, classes)

    def forward(self, x):
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.layers(self.stem(x)), 1), 1))


class InvertedResidual(nn.Module):
    def __init__(self, c, expand):
        super().__init__()
        h = c * expand
        self.body = nn.Sequential(
            nn.Conv2d(c, h, 1, bias=False), nn.BatchNorm2d(h), nn.Hardswish(),
            nn.Conv2d(h, h, 3, 1, 1, groups=h, bias=False), nn.BatchNorm2d(h), nn.ReLU6(),
            nn.Conv2d(h, c, 1, bias=False), nn.BatchNorm2d(c),
        )

    def forward(self, x):
        return x + self.body(x)


class TinyMobileNet(nn.Module):
    """MobileNetV2/V3-style: depthwise separable inverted residuals, hardswish, ReLU6."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 2, 1, bias=False), nn.BatchNorm2d(16), nn.Hardswish())
        self.blocks = nn.Sequential(InvertedResidual(16, 4), InvertedResidual(16, 6))
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x)).mean((2, 3)))


def randomized(model):
    """Eval mode with non-trivial batch-norm statistics."""
    torch.manual_seed(0)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
            nn.init.uniform_(m.weight, 0.5, 1.5)
            nn.init.uniform_(m.bias, -0.2, 0.2)
    return model.eval()


def test_backend_is_registered():
    assert "tilec" in torch._dynamo.list_backends()


def test_resnet_style_matches_eager_with_a_dynamic_batch():
    torch.manual_seed(1)
    m = randomized(TinyResNet())
    compiled_by_tilec(m, (torch.randn(2, 3, 64, 64),), (torch.randn(3, 3, 64, 64),), (torch.randn(5, 3, 64, 64),))


def test_mobilenet_style_matches_eager():
    torch.manual_seed(2)
    m = randomized(TinyMobileNet())
    compiled_by_tilec(m, (torch.randn(2, 3, 32, 32),))


def test_torchvision_resnet18_and_mobilenet_v2_match_eager():
    tv = pytest.importorskip("torchvision", reason="torchvision is not installed (scripts/setup-export-venv.sh)")
    for seed, build in [(10, tv.models.resnet18), (11, tv.models.mobilenet_v2)]:
        torch._dynamo.reset()
        torch.manual_seed(seed)
        m = randomized(build(weights=None, num_classes=10))
        compiled_by_tilec(m, (torch.randn(2, 3, 64, 64),), atol=2e-3, rtol=2e-3)


def test_gpt2_style_transformer_matches_eager():
    transformers = pytest.importorskip("transformers", reason="transformers is not installed (scripts/setup-export-venv.sh)")
    cfg = transformers.GPT2Config(
        vocab_size=256, n_positions=64, n_embd=64, n_layer=2, n_head=4, use_cache=False,
        attn_implementation="eager",
    )
    torch.manual_seed(3)
    model = transformers.GPT2LMHeadModel(cfg).eval()

    def logits(ids):
        return model(input_ids=ids).logits

    g = torch.Generator().manual_seed(4)
    compiled_by_tilec(
        logits,
        (torch.randint(0, 256, (2, 16), generator=g),),
        (torch.randint(0, 256, (2, 24), generator=g),),
    )


def test_graph_break_compiles_both_graphs():
    def f(x):
        y = torch.tanh(x) * 2
        torch._dynamo.graph_break()
        return torch.sigmoid(y) + x

    before = tilec.dynamo.stats["compiled"]
    compiled_by_tilec(f, (torch.randn(4, 8),))
    assert tilec.dynamo.stats["compiled"] - before == 2


def test_unsupported_op_falls_back_with_one_warning_naming_it():
    def f(x):
        return torch.relu(x) + 0 * torch.rand_like(x)

    c = torch.compile(f, backend="tilec")
    eager_before = tilec.dynamo.stats["eager"]
    tilec.dynamo._warned.clear()
    with torch.no_grad(), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        for _ in range(3):
            x = torch.randn(4, 4)
            torch.testing.assert_close(c(x), torch.relu(x))
    msgs = [str(m.message) for m in w if "tilec" in str(m.message)]
    assert msgs == ["tilec: op RandomUniformLike is not supported; this graph runs eagerly"]
    assert tilec.dynamo.stats["eager"] == eager_before + 1


def test_export_failure_falls_back_with_the_cause():
    def f(x):
        return torch.erfinv(x.clamp(-0.5, 0.5))  # no ONNX function in the exporter

    c = torch.compile(f, backend="tilec")
    tilec.dynamo._warned.clear()
    with torch.no_grad(), warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        x = torch.randn(3, 8)
        torch.testing.assert_close(c(x), f(x))
    (msg,) = [str(m.message) for m in w if "tilec" in str(m.message)]
    assert msg.startswith("tilec: the ONNX export failed: ") and "erf_inv" in msg


def test_training_graph_runs_eagerly_with_gradients():
    m = nn.Linear(4, 3)
    c = torch.compile(m, backend="tilec")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        c(torch.randn(2, 4)).sum().backward()
    assert m.weight.grad is not None
    assert any("autograd" in str(x.message) for x in w)


def test_options_dtype_bfloat16():
    torch.manual_seed(5)
    m = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)).eval()
    compiled_by_tilec(m, (torch.randn(4, 32),), options={"dtype": "bfloat16"}, atol=5e-2, rtol=5e-2)


def test_options_unfrozen_weights_are_inputs():
    torch.manual_seed(6)
    m = nn.Linear(8, 8).eval()
    c = compiled_by_tilec(m, (torch.randn(2, 8),), options={"freeze": False})
    with torch.no_grad():
        m.weight.mul_(2)  # seen by the compiled graph: weights are inputs, not constants
        x = torch.randn(2, 8)
        torch.testing.assert_close(c(x), m(x), atol=1e-4, rtol=1e-4)
