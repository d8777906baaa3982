"""The causal unit vocoder on small random float32 weights: its pieces against alias-free-torch
(the resampling code BigVGAN adopted) and a non-causal reference written here from the BigVGAN
paper, each causal piece equal to the non-causal one delayed by its lag away from the edges;
chunked and batched decoding against one-shot decoding; the state's split and stack; the
loader on the tiny checkpoint, the speaker encoder and the config's errors."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import alias_free_torch
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from gpu_workers.models.unit_vocoder import (
    SPEAKER_ENCODER_FILE,
    SPEAKERS_FILE,
    Activation1d,
    AMPBlock,
    CausalConv1d,
    CausalConvTranspose1d,
    CausalLayer,
    DownSample1d,
    SnakeBeta,
    Stream,
    UnitVocoder,
    UnitVocoderConfig,
    UpSample1d,
    VocoderState,
    kaiser_sinc_filter,
    load_unit_vocoder,
    random_unit_vocoder,
)
from gpu_workers.tiny.checkpoints import TINY_VOICES, make_tiny_audio_decoder

# A fast config for the streaming tests: hop 24 (600 Hz, 25 units a second) in three stages,
# one of them with kernel == stride (no context at all) and one whose kernel is not a multiple
# of its stride; two AMP kernels with different dilations.
FAST = UnitVocoderConfig(
    num_units=20,
    unit_embed_dim=8,
    num_speakers=3,
    speaker_embed_dim=4,
    sample_rate=600,
    units_per_second=25,
    upsample_rates=(2, 3, 4),
    upsample_kernel_sizes=(4, 3, 9),
    upsample_initial_channel=32,
    resblock_kernel_sizes=(3, 5),
    resblock_dilation_sizes=((1, 3), (1, 2)),
)
RATIO, TAPS = 2, 12  # BigVGAN's anti-aliasing; the lags below are for these
ACT_LAG = 5  # ((12 - 2) // 2 + (12 - 2) - (12 // 2 - 1)) / 2: see the module docstring


@pytest.fixture(scope="module")
def fast() -> UnitVocoder:
    return random_unit_vocoder(FAST, seed=0)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_audio_decoder(tmp_path_factory.mktemp("tiny") / "audio_decoder", seed=6)


def units_for(n: int, seed: int, num_units: int = FAST.num_units, rows: int = 1) -> torch.Tensor:
    return torch.randint(0, num_units, (rows, n), generator=torch.Generator().manual_seed(seed))


def run_alone(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """One call of a causal module from a fresh (zero) state."""
    for name, m in layer.named_modules():
        if isinstance(m, CausalLayer):
            m.name = name or "layer"
    contexts = {
        m.name: torch.zeros(x.shape[0], m.channels, m.context) for m in layer.modules() if isinstance(m, CausalLayer)
    }
    with torch.no_grad():
        out: torch.Tensor = layer(x, Stream(VocoderState(contexts), None))
    return out


def randomize_snake(snake: SnakeBeta, seed: int) -> SnakeBeta:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        snake.alpha.copy_(0.5 * torch.randn(snake.alpha.shape, generator=gen))
        snake.beta.copy_(0.5 * torch.randn(snake.beta.shape, generator=gen))
    return snake


def signal(channels: int, length: int, seed: int = 0) -> torch.Tensor:
    return 2 * torch.randn(2, channels, length, generator=torch.Generator().manual_seed(seed))


# ---- parity: each piece against a non-causal reference, delayed ----------------------------


@pytest.mark.parametrize(("ratio", "taps"), [(2, 12), (2, 11), (3, 18)])
def test_the_kaiser_sinc_filter_is_alias_free_torchs(ratio: int, taps: int) -> None:
    ours = kaiser_sinc_filter(0.5 / ratio, 0.6 / ratio, taps)
    reference = alias_free_torch.filter.kaiser_sinc_filter1d(0.5 / ratio, 0.6 / ratio, taps).view(-1)
    assert torch.equal(ours, reference)
    assert abs(ours.sum().item() - 1.0) < 1e-6


@pytest.mark.parametrize("logscale", [True, False])
def test_snake_beta_is_the_papers_formula(logscale: bool) -> None:
    snake = SnakeBeta(6, logscale)
    with torch.no_grad():
        snake.alpha.copy_(torch.linspace(-0.5, 0.5, 6) + (0 if logscale else 1))
        snake.beta.copy_(torch.linspace(0.4, -0.3, 6) + (0 if logscale else 1))
    x = signal(6, 50)
    a, b = snake.alpha.detach()[None, :, None], snake.beta.detach()[None, :, None]
    if logscale:
        a, b = a.exp(), b.exp()
    expected = x + torch.sin(a * x) ** 2 / (b + 1e-9)  # arXiv 2206.04658, eq. 2 with its beta
    with torch.no_grad():
        torch.testing.assert_close(snake(x), expected, rtol=0, atol=1e-6)


def test_upsampling_is_alias_free_torchs_delayed() -> None:
    up = UpSample1d(3, 1, FAST)
    x = signal(3, 80)
    ours, reference = run_alone(up, x), alias_free_torch.UpSample1d(RATIO, TAPS)(x)  # (B, C, 160)
    lag = (TAPS - RATIO) // 2  # 5 upsampled samples
    edge = 12  # zero context (ours) against replicate padding (theirs)
    # within rounding: ours sums the taps per output phase, theirs by a transposed convolution
    torch.testing.assert_close(ours[..., lag + edge : -edge], reference[..., edge : -edge - lag], rtol=1e-6, atol=1e-6)


def test_downsampling_is_alias_free_torchs_delayed() -> None:
    down = DownSample1d(3, 2, FAST)
    v = signal(3, 160)
    ours = run_alone(down, v)  # (B, C, 80)
    # our window for output i ends on input 2i + 1, theirs is centred on 2i + 0.5; fed the
    # input one sample late, theirs is ours two outputs early
    late = torch.cat([v[..., :1], v[..., :-1]], dim=-1)
    reference = alias_free_torch.DownSample1d(RATIO, TAPS)(late)
    edge = 8
    assert torch.equal(ours[..., 2 + edge : -edge], reference[..., edge : -edge - 2])


def test_the_anti_aliased_activation_is_alias_free_torchs_delayed() -> None:
    act = Activation1d(4, 1, FAST)
    randomize_snake(act.act, 1)
    x = signal(4, 100)
    reference = alias_free_torch.Activation1d(act.act, RATIO, RATIO, TAPS, TAPS)
    with torch.no_grad():
        theirs = reference(x)
    ours = run_alone(act, x)
    edge = 12
    assert ours.shape == x.shape
    delayed = theirs[..., edge : -edge - ACT_LAG]
    torch.testing.assert_close(ours[..., ACT_LAG + edge : -edge], delayed, rtol=1e-6, atol=1e-6)


def test_causal_convolutions_are_delayed_symmetric_ones() -> None:
    gen = torch.Generator().manual_seed(2)
    conv = CausalConv1d(4, 5, 7, rate=1, dilation=3)
    up = CausalConvTranspose1d(4, 3, 10, stride=4, rate=1)
    with torch.no_grad():
        for p in [*conv.parameters(), *up.parameters()]:
            p.copy_(0.3 * torch.randn(p.shape, generator=gen))
    x = signal(4, 60)
    ours = run_alone(conv, x)
    lag = (7 - 1) * 3 // 2  # BigVGAN's get_padding(7, 3) each side
    reference = F.conv1d(x, conv.weight, conv.bias, padding=lag, dilation=3)
    torch.testing.assert_close(ours[..., 2 * lag :], reference[..., lag:-lag], rtol=0, atol=1e-5)
    ours_up = run_alone(up, x)  # (B, 3, 240)
    lag = (10 - 4) // 2  # BigVGAN's ups padding
    reference = F.conv_transpose1d(x, up.weight, up.bias, stride=4, padding=lag)
    assert ours_up.shape == reference.shape == (2, 3, 240)
    torch.testing.assert_close(ours_up[..., 2 * lag :], reference[..., lag:-lag], rtol=0, atol=1e-5)
    with torch.no_grad():
        up.weight.mul_(-0.5)  # the phase kernels made of the old weights must not be reused
    reference = F.conv_transpose1d(x, up.weight, up.bias, stride=4, padding=lag)
    torch.testing.assert_close(run_alone(up, x)[..., 2 * lag :], reference[..., lag:-lag], rtol=0, atol=1e-5)


def reference_amp_block(block: AMPBlock, x: torch.Tensor, kernel: int, dilations: tuple[int, ...]) -> torch.Tensor:
    """BigVGAN's AMPBlock1 from the paper, non-causal (symmetric padding, alias-free-torch's
    Activation1d), with each residual branch delayed by its causal lag: a causal block adds
    its branch undelayed to x, so it equals no delayed non-causal block as a whole."""
    acts = [
        alias_free_torch.Activation1d(a.act, RATIO, RATIO, TAPS, TAPS) for a in block.activations
    ]  # fmt: skip
    for s, d in enumerate(dilations):
        c1, c2 = block.convs1[s], block.convs2[s]
        assert isinstance(c1, CausalConv1d) and isinstance(c2, CausalConv1d)
        h = F.conv1d(acts[2 * s](x), c1.weight, c1.bias, padding=(kernel - 1) * d // 2, dilation=d)
        h = F.conv1d(acts[2 * s + 1](h), c2.weight, c2.bias, padding=(kernel - 1) // 2)
        lag = ACT_LAG + (kernel - 1) * d // 2 + ACT_LAG + (kernel - 1) // 2
        x = x + F.pad(h, (lag, 0))[..., : x.shape[-1]]
    return x


def test_an_amp_block_is_the_papers_with_delayed_branches() -> None:
    kernel, dilations = 5, (1, 3, 5)
    block = AMPBlock(6, kernel, dilations, 1, FAST)
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(0.2 * torch.randn(p.shape, generator=gen))
    x = signal(6, 300)
    with torch.no_grad():
        expected = reference_amp_block(block, x, kernel, dilations)
    ours = run_alone(block, x)
    edge = 100  # the three stages' receptive field: zero context against replicate padding
    torch.testing.assert_close(ours[..., edge:-edge], expected[..., edge:-edge], rtol=0, atol=1e-5)
    assert (ours - x).abs().max() > 0.1  # the branches did something


# ---- streaming ----------------------------------------------------------------------------


def decode_in_chunks(model: UnitVocoder, units: torch.Tensor, speaker: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    state = model.init_state(units.shape[0])
    pieces = []
    start = 0
    with torch.no_grad():
        for size in sizes:
            audio, state = model.decode_chunk(units[:, start : start + size], speaker, state)
            assert audio.shape == (units.shape[0], size * model.config.hop)
            pieces.append(audio)
            start += size
    assert start == units.shape[1]
    return torch.cat(pieces, dim=-1)


@pytest.mark.parametrize("sizes", [[1] * 16, [3, 5, 2, 6], [16], [2, 1, 7, 6]])
def test_chunked_decoding_equals_one_shot_decoding(fast: UnitVocoder, sizes: list[int]) -> None:
    units = units_for(16, seed=4, rows=2)
    speaker = fast.speaker_embedding(torch.tensor([0, 2]))
    with torch.no_grad():
        one_shot = fast(units, speaker)
    assert one_shot.shape == (2, 16 * FAST.hop)
    assert torch.equal(decode_in_chunks(fast, units, speaker, sizes), one_shot)


def test_the_path_without_onednn_computes_the_same(fast: UnitVocoder) -> None:
    """float64 takes F.conv1d (the path a GPU takes), float32 on the CPU oneDNN; both compute
    the same function, and chunking in float64 still gives the one-shot samples closely."""
    wide = random_unit_vocoder(FAST, seed=0, dtype=torch.float64)
    units = units_for(9, seed=12, rows=2)
    voices = torch.tensor([1, 0])
    with torch.no_grad():
        single = fast(units, fast.speaker_embedding(voices))
        double = wide(units, wide.speaker_embedding(voices))
        chunked = decode_in_chunks(wide, units, wide.speaker_embedding(voices), [1, 4, 4])
    torch.testing.assert_close(double.float(), single, rtol=0, atol=1e-5)
    torch.testing.assert_close(chunked, double, rtol=0, atol=1e-12)


def test_chunked_decoding_at_the_real_hop(tiny_dir: Path) -> None:
    tiny = load_unit_vocoder(tiny_dir).vocoder
    units = units_for(6, seed=5, num_units=tiny.config.num_units)
    speaker = tiny.speaker_embedding(torch.tensor([1]))
    with torch.no_grad():
        one_shot = tiny(units, speaker)
    assert one_shot.shape == (1, 6 * 960)
    assert torch.equal(decode_in_chunks(tiny, units, speaker, [2, 1, 3]), one_shot)


def padded_chunks(requests: list[torch.Tensor], step: int, fill: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The batches a worker would send: each step up to `step` units of every request, the
    shorter rows right-padded with `fill`, and each row's valid count."""
    done = [0] * len(requests)
    while any(d < r.numel() for d, r in zip(done, requests, strict=True)):
        rows, lengths = [], []
        for i, r in enumerate(requests):
            piece = r[done[i] : done[i] + step]
            lengths.append(piece.numel())
            rows.append(F.pad(piece, (0, step - piece.numel()), value=fill))
            done[i] += piece.numel()
        yield torch.stack(rows), torch.tensor(lengths)


def test_batched_rows_of_different_lengths_decode_as_each_alone(fast: UnitVocoder) -> None:
    requests = [units_for(n, seed=10 + n)[0] for n in (13, 4, 9)]
    speaker = fast.speaker_embedding(torch.tensor([0, 1, 2]))
    state = fast.init_state(3)
    audio: list[list[torch.Tensor]] = [[], [], []]
    with torch.no_grad():
        for chunk, lengths in padded_chunks(requests, step=5, fill=FAST.num_units - 1):
            out, state = fast.decode_chunk(chunk, speaker, state, lengths)
            for i, n in enumerate(lengths.tolist()):
                audio[i].append(out[i, : n * FAST.hop])
        for i, r in enumerate(requests):
            alone = fast(r[None], speaker[i : i + 1])[0]
            assert torch.equal(torch.cat(audio[i]), alone)


def test_each_rows_state_is_taken_at_its_own_end(fast: UnitVocoder) -> None:
    """One request twice in a batch of two, chunked differently through `lengths`: the rows
    share every kernel call, so any slip in where a row's state is cut shows bit for bit."""
    units = units_for(12, seed=6)[0]
    speaker = fast.speaker_embedding(torch.tensor([1, 1]))
    schedules = ([4, 4, 4, 0], [1, 5, 2, 4])
    state = fast.init_state(2)
    done = [0, 0]
    audio: list[list[torch.Tensor]] = [[], []]
    with torch.no_grad():
        for step in range(4):
            sizes = [s[step] for s in schedules]
            width = max(sizes)
            chunk = torch.stack([F.pad(units[d : d + n], (0, width - n), value=0) for d, n in zip(done, sizes)])
            out, state = fast.decode_chunk(chunk, speaker, state, torch.tensor(sizes))
            for i, n in enumerate(sizes):
                audio[i].append(out[i, : n * FAST.hop])
                done[i] += n
        one_shot = fast(torch.stack([units, units]), speaker)
    assert torch.equal(torch.cat(audio[0]), torch.cat(audio[1]))
    assert torch.equal(torch.cat(audio[0]), one_shot[0])


def test_states_split_and_stack_round_trip(fast: UnitVocoder) -> None:
    units = units_for(10, seed=7, rows=3)
    speaker = fast.speaker_embedding(torch.tensor([2, 0, 1]))
    with torch.no_grad():
        _, state = fast.decode_chunk(units[:, :6], speaker, fast.init_state(3))
        rows = state.split()
        assert [r.batch_size for r in rows] == [1, 1, 1]
        stacked = VocoderState.stack(rows)
        assert stacked.contexts.keys() == state.contexts.keys()
        assert all(torch.equal(stacked.contexts[n], c) for n, c in state.contexts.items())
        expected, _ = fast.decode_chunk(units[:, 6:], speaker, state)
        # rows regrouped in another order continue as they would have
        order = [2, 0]
        regrouped = VocoderState.stack([rows[i] for i in order])
        again, _ = fast.decode_chunk(units[order, 6:], speaker[order], regrouped)
        torch.testing.assert_close(again, expected[order], rtol=0, atol=1e-6)
        same, _ = fast.decode_chunk(units[:, 6:], speaker, stacked)
        assert torch.equal(same, expected)
    assert state.contexts["conv_pre"].shape == (3, FAST.unit_embed_dim + FAST.speaker_embed_dim, 6)
    assert state.contexts["ups.1"].shape == (3, 16, 0)  # kernel 3 == stride 3: no context
    with pytest.raises(ValueError, match="no vocoder states"):
        VocoderState.stack([])


def test_decode_chunk_refuses_bad_inputs(fast: UnitVocoder) -> None:
    speaker = fast.speaker_embedding(torch.tensor([0]))
    state = fast.init_state(1)
    with pytest.raises(ValueError, match=r"units must be in \[0, 20\)"):
        fast.decode_chunk(torch.tensor([[3, 20]]), speaker, state)
    with pytest.raises(ValueError, match="speaker"):
        fast.decode_chunk(torch.tensor([[3]]), speaker[:, :2], state)
    with pytest.raises(ValueError, match="state holds 1 rows"):
        fast.decode_chunk(torch.tensor([[3], [4]]), speaker.expand(2, -1), state)
    with pytest.raises(ValueError, match="lengths"):
        fast.decode_chunk(torch.tensor([[3, 4]]), speaker, state, torch.tensor([3]))


# ---- the checkpoint ------------------------------------------------------------------------

def test_the_tiny_audio_decoder_loads_and_speaks(tmp_path: Path) -> None:
    root = make_tiny_audio_decoder(tmp_path / "a", seed=6)
    loaded = load_unit_vocoder(root)
    c = loaded.config
    assert loaded.voices == TINY_VOICES == ("amber", "basalt", "cobalt", "linen")
    assert (c.num_units, c.sample_rate, c.hop, c.num_speakers) == (81, 24000, 960, 4)
    units = units_for(25, seed=8, num_units=81)
    with torch.no_grad():
        voices = [loaded.vocoder(units, loaded.voice_embedding(v)[None])[0] for v in ("amber", "linen")]
    for audio in voices:
        rms = audio.pow(2).mean().sqrt().item()
        assert 0.01 < rms < 0.5, rms  # neither silent nor saturating tanh
        assert audio.abs().max().item() < 0.99
    assert (voices[0] - voices[1]).abs().max() > 0.05  # the voice matters
    with pytest.raises(ValueError, match="unknown voice 'alloy'; the voices are amber, basalt, cobalt, linen"):
        loaded.voice_index("alloy")
    # deterministic: the same seed writes the same bytes, another seed other weights
    again = make_tiny_audio_decoder(tmp_path / "b", seed=6)
    other = make_tiny_audio_decoder(tmp_path / "c", seed=7)
    for name in sorted(p.name for p in root.iterdir()):
        assert (root / name).read_bytes() == (again / name).read_bytes(), name
    assert (root / "model.safetensors").read_bytes() != (other / "model.safetensors").read_bytes()


def test_the_speaker_encoder_embeds_a_recording(tiny_dir: Path) -> None:
    loaded = load_unit_vocoder(tiny_dir)
    encoder = loaded.speaker_encoder
    assert encoder is not None and encoder.config.sample_rate == 16000
    gen = torch.Generator().manual_seed(9)
    first = encoder.embed(0.1 * torch.randn(16000, generator=gen))
    second = encoder.embed(torch.sin(torch.arange(24000) * 0.05) * 0.3)
    assert first.shape == second.shape == (16,)
    assert torch.isfinite(first).all() and (first - second).abs().max() > 1e-3
    with torch.no_grad():
        audio = loaded.vocoder(units_for(5, seed=1, num_units=81), first[None])
    assert audio.shape == (1, 4800) and torch.isfinite(audio).all()
    with pytest.raises(ValueError, match="at least 400 samples"):
        encoder.embed(torch.zeros(100))


def test_the_loader_refuses_broken_directories(tmp_path: Path) -> None:
    root = make_tiny_audio_decoder(tmp_path / "a", seed=6)
    (root / SPEAKERS_FILE).write_text(json.dumps({"speakers": ["one", "two"]}))
    with pytest.raises(ValueError, match="2 speakers, but config.json's num_speakers is 4"):
        load_unit_vocoder(root)
    (root / SPEAKERS_FILE).write_text(json.dumps({"speakers": ["a", "a", "b", "c"]}))
    with pytest.raises(ValueError, match="distinct"):
        load_unit_vocoder(root)
    (root / SPEAKERS_FILE).write_text(json.dumps({"speakers": list(TINY_VOICES)}))
    config = json.loads((root / "config.json").read_text())
    del config["speaker_encoder"]
    (root / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="no speaker_encoder section"):
        load_unit_vocoder(root)
    (root / SPEAKER_ENCODER_FILE).unlink()
    assert load_unit_vocoder(root).speaker_encoder is None
    (root / "config.json").write_text(json.dumps({**config, "unit_embed_dim": 16}))
    with pytest.raises(ValueError, match="unit vocoder weight"):
        load_unit_vocoder(root)


def test_config_round_trips_and_names_the_bad_field(tiny_dir: Path) -> None:
    assert UnitVocoderConfig.from_dict(FAST.to_dict()) == FAST
    tiny = UnitVocoderConfig.from_dict(json.loads((tiny_dir / "config.json").read_text()))
    assert UnitVocoderConfig.from_dict(tiny.to_dict()) == tiny and tiny.speaker_encoder is not None
    assert UnitVocoderConfig().hop == 960
    bad = {
        "upsample_rates": ([8, 5, 4, 3, 3], r"upsample_rates \[8, 5, 4, 3, 3\] multiply to 1440, want 960"),
        "upsample_kernel_sizes": ([16, 10, 8, 6, 1], "upsample_kernel_sizes"),
        "resblock_dilation_sizes": ([[1, 3, 5]], "resblock_dilation_sizes has 1 lists"),
        "upsample_initial_channel": (48, "upsample_initial_channel 48 must halve 5 times"),
        "num_units": (0, "num_units must be a positive int"),
        "antialias_cutoff": (0.7, "antialias_cutoff"),
        "snake_logscale": ("yes", "snake_logscale must be true or false"),
        "upsample_rate": ([960], r"unknown keys \['upsample_rate'\]"),
        "speaker_encoder": ({"channels": 0}, "speaker_encoder.channels must be a positive int"),
        "model_type": ("bigvgan", "model_type 'bigvgan' is not omni_unit_vocoder"),
    }
    base = {**tiny.to_dict(), "upsample_rates": [8, 5, 4, 3, 2]}
    for key, (value, message) in bad.items():
        with pytest.raises(ValueError, match=message):
            UnitVocoderConfig.from_dict({**base, key: value})
