"""Reference models: the small CNN of the default demo, the CIFAR ResNets of the paper (§6.2; ResNet-20 is
``resnet`` with ``n: 3``) and a byte-level transformer language model."""
from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    """A small CNN for 8×8 (digits) or 28×28 (MNIST) single-channel images."""

    def __init__(self, image_size: int = 8, num_classes: int = 10, width: int = 32):
        super().__init__()
        if image_size < 4:
            raise ValueError(f"image_size must be >= 4, got {image_size}")
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.ReLU(),
            nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
            nn.MaxPool2d(2),
        )
        side = image_size // 2
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(width * side * side, 128), nn.ReLU(), nn.Linear(128, num_classes))

    def forward(self, x):
        return self.head(self.features(x))


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return torch.relu(y + (x if self.short is None else self.short(x)))


class CifarResNet(nn.Module):
    """He et al.'s CIFAR ResNet-(6n+2): ResNet-110 is ``n=18`` (1.7M parameters)."""

    def __init__(self, n: int = 18, num_classes: int = 10, in_channels: int = 3):
        super().__init__()
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        self.stem = nn.Sequential(nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU())
        layers, cin = [], 16
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            for i in range(n):
                layers.append(_Block(cin, cout, stride if i == 0 else 1))
                cin = cout
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(64, num_classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


def resnet110(num_classes: int = 10) -> CifarResNet:
    return CifarResNet(18, num_classes)


class MLP(nn.Module):
    """A plain MLP on flattened inputs (``hidden`` layer widths)."""

    def __init__(self, in_features: int = 64, hidden: tuple = (256, 256), num_classes: int = 10):
        super().__init__()
        layers, prev = [nn.Flatten()], in_features
        for h in hidden:
            layers += [nn.Linear(prev, h), nn.ReLU()]
            prev = h
        layers.append(nn.Linear(prev, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


class ByteTransformer(nn.Module):
    """A small decoder-only transformer language model over byte tokens (:mod:`mpca.data.text`).

    Pre-LayerNorm blocks of causal self-attention and a GELU MLP (``torch.nn.TransformerEncoderLayer`` with a
    causal mask), learned position embeddings, a final LayerNorm and an untied output layer.  The input is
    (rows, T) token ids — integers, or floats holding integers as the data pipeline delivers them — with
    T ≤ ``context``; the output is (rows, T, ``vocab_size``) logits of each position's next token
    (:func:`cross_entropy` takes them with (rows, T) labels).  The defaults (width 128, 5 blocks) hold
    1.07 M parameters, the size the benchmark's regimes were calibrated with (``conf/teacher_mlp.yaml``)."""

    def __init__(self, vocab_size: int = 256, context: int = 128, width: int = 128, layers: int = 5,
                 heads: int = 4, dropout: float = 0.0):
        super().__init__()
        if width % heads:
            raise ValueError(f"width {width} must be a multiple of heads {heads}")
        self.vocab_size, self.context = vocab_size, context
        self.embed = nn.Embedding(vocab_size, width)
        self.position = nn.Embedding(context, width)
        block = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout, activation="gelu", batch_first=True,
                                           norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size)

    def forward(self, x):
        tokens = x.long() if x.is_floating_point() else x
        if tokens.dim() != 2 or tokens.shape[1] > self.context:
            raise ValueError(f"the model takes (rows, T <= {self.context}) token ids, got shape {tuple(x.shape)}")
        # one clear line for ids outside the vocabulary; not on a GPU, where reading them back would stall every
        # step (the embedding's own device-side assert stops the run there)
        lo, hi = (0, 0) if tokens.is_cuda else (int(tokens.min()), int(tokens.max()))
        if lo < 0 or hi >= self.vocab_size:
            raise ValueError(f"token ids must lie in 0..{self.vocab_size - 1} (the model's vocab_size), got "
                             f"{lo}..{hi}")
        t = tokens.shape[1]
        h = self.embed(tokens) + self.position(torch.arange(t, device=tokens.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=tokens.device)
        return self.head(self.norm(self.blocks(h, mask=mask, is_causal=True)))


MODELS = {"small_cnn": SmallCNN, "resnet": CifarResNet, "mlp": MLP, "transformer": ByteTransformer}


def build_model(name: str, args: dict) -> nn.Module:
    """A model by registry name or ``package.module:function`` (importable on the executors too)."""
    if ":" in name:
        import importlib

        mod, _, fn = name.partition(":")
        return getattr(importlib.import_module(mod), fn)(**args)
    return MODELS[name](**args)


def check_model_name(name: str, args: dict) -> None:
    """Build the model once on the driver so that a bad name or argument fails before Spark starts."""
    from mpca.errors import UserError

    if ":" not in name and name not in MODELS:
        raise UserError(f"model.name {name!r} is unknown; use one of {sorted(MODELS)} or 'package.module:function'")
    try:
        build_model(name, args)
    except (ImportError, AttributeError) as e:
        raise UserError(f"model.name {name!r} cannot be imported: {e}") from None
    except TypeError as e:
        raise UserError(f"model.args do not fit model {name!r}: {e}") from None


def build_optimizer(name: str, lr: float, momentum: float, weight_decay: float, params):
    """The configured optimizer (arguments first so that ``functools.partial`` leaves ``params`` open)."""
    if name == "adam":
        return torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)


def cross_entropy(out, y):
    """Mean cross-entropy in nats: of one class label per row (``out`` (n, C), ``y`` (n,)), or of one label per
    position of a sequence (``out`` (n, T, C), ``y`` (n, T): a language model's next tokens)."""
    if out.dim() == 3 and y.dim() == 2:
        return torch.nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())
    return torch.nn.functional.cross_entropy(out, y)


def training_functions(model, optimizer):
    """(model_fn, loss_fn, optimizer_fn) of a job's ``model`` and ``optimizer`` sections, picklable for the
    executors."""
    import functools

    return (functools.partial(build_model, model.name, dict(model.args)), cross_entropy,
            functools.partial(build_optimizer, optimizer.name, optimizer.lr, optimizer.momentum,
                              optimizer.weight_decay))
