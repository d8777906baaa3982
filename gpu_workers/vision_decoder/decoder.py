"""VisionDecoder: a batch of image jobs (codes in) to encoded images (bytes out).

The checkpoint: either layout of layout.py (the published decoder/vision/ or
ours), read by DecoderFolder.

A batch's jobs share width, height and steps (the server batches them so); everything else
(codes, seed, guidance scale, output format, previews) is per job. A job's guidance_scale of
None takes the config's; "none" has no scale and ignores it. For a W x H image, with
the VAE's 8x and the DiT's patch p (1 or 2):

    noise      initial_noise((16, H/8, W/8), seed)     per job, drawn on the CPU
    condition  condition_from_codes(codes, codebook, grid)   map and vec; grid = (H/8, W/8),
                                                       or the token grid (H/16, W/16) when the
                                                       condition is not packed (use_patchify)
    tokens     patchify(noise, p) | patchify(map, cp)  (B, S, p*p*16 + cp*cp*cond),
                                                       S = H/8p * W/8p; cp = p or 1
    step i     v = guidance(DiT(tokens, t_i), ...)     t_i = int(sigma_i * 1000): the truncated
               x <- x + (sigma_{i+1} - sigma_i) * v    timestep; the step uses exact sigmas
    preview    x0 = x_i - sigma_i * v_i                the clean latent the step predicts
    image      VAE(unpatchify(x)), clamped, encoded    png | jpeg | webp (pixels truncated to
                                                       uint8, as the reference)

Rank 0's images are encoded (PIL, which releases the GIL) on a small thread pool: the worker
thread decodes the next image's latent with the VAE, or runs the next denoising steps after a
preview, while the last one is encoded. Step times come from CUDA events read once a batch
(the wall clock on the CPU), so no step waits for the device.

Step cache (step_cache.py): a job's step_cache threshold above 0 lets its rows skip the DiT's
blocks after the first at steps whose first block barely moved; each DiT pass of a step keeps
its own memory, and each image reports its blocks computed and skipped (DecodedImage).

The latent stays float32 between steps (the reference, in bf16 throughout, rounds it to bf16
after each step); everything else follows the reference's arithmetic.

Previews: a job with partial_images = p gets them after steps floor(k * N / (p + 1)),
k = 1..p, of N steps (25 steps, 3 previews: steps 6, 12, 18); with N >= p + 2 that is p
distinct steps before the last, with fewer steps some coincide or reach the last one (whose
prediction is the image itself) and are left out: 2 steps give at most 1 preview.

Ulysses: the same generate runs on every rank of a torch.distributed group. Every rank holds
the DiT weights, draws the whole noise and condition (cheap next to a step) and keeps its
shard of the token axis (gpu_workers/attention/ulysses.py):

    token       0 ......... L-1 | L ........ 2L-1 | ... | (N-1)L ... S-1 (pad to NL)
    held by     rank 0          | rank 1          | ... | rank N-1

The latent stays sharded through every step (the Euler step and guidance are per token; only
attention talks to the other ranks) and is gathered for previews and at the end. Rank 0 alone
loads the VAE and decodes and encodes; the other ranks return no images.

Guidance in parallel (guidance_parallel.py): a group of 2N ranks runs a TwoPassGuidance's two
passes at once, ranks [0, N) the first (the transformer; CFG's conditional pass) and [N, 2N) the
second (the twin; the unconditional pass), each half a Ulysses group of N as above; a rank loads
only its own pass's DiT (TwoPassGuidance.for_role), and every rank ends each step with the same
velocity, so the loop below runs unchanged on all of them.

A job this decoder cannot draw (codes of the wrong count or out of range, a size that is not a
multiple of 16, an unknown format) gets DecodedImage.error, a client error, and the others in
its batch are drawn as if it were not there.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Generator, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from gpu_workers.models.checkpoint_io import read_json
from gpu_workers.models.flow_match import FlowMatchSchedule, euler_step, initial_noise
from gpu_workers.models.flux_dit import FluxDiT, condition_from_codes, patchify, position_ids, unpatchify
from gpu_workers.models.flux_vae import IMAGE_FORMATS, FluxVAEConfig, FluxVAEDecoder, to_image_bytes
from gpu_workers.vision_decoder import compiled_dit
from gpu_workers.vision_decoder.guidance import (
    GUIDANCE,
    ClassifierFreeGuidance,
    Guidance,
    StepInputs,
    TokenShard,
    TwoPassGuidance,
    parallel_velocity,
)
from gpu_workers.vision_decoder.guidance_parallel import GuidanceGroups
from gpu_workers.vision_decoder.layout import DecoderFolder, VisionDecoderConfig
from gpu_workers.vision_decoder.step_cache import StepCache, StepCachePolicy
from omni.shared import protocol
from omni.shared.media.image_sizes import PATCH_SCALE

MAX_PREVIEWS = 3  # OpenAI's partial_images range is 0..3
# The server sends sizes of its table (about 768^2 pixels); a bound on a side keeps a bad job
# from allocating without limit.
MAX_SIDE = 2048
TIMESTEP_SCALE = 1000.0  # the DiT's timestep input is sigma on a 0..1000 scale
ENCODE_THREADS = 4  # rank 0's image encoders (PNG of a 768^2 image: tens of ms)


@dataclass(frozen=True, slots=True)
class Preview:
    job_id: int
    index: int  # 0-based, in step order
    data: bytes


@dataclass(slots=True)
class Generation:
    """A batch's outcome. images, one per job in job order, and latents only on rank 0."""

    images: list[protocol.DecodedImage]
    latents: torch.Tensor | None  # (B_drawn, 16, H/8, W/8) float32 before the VAE, drawn jobs in order
    step_seconds: float = 0.0  # mean per step, every pass of every guidance model
    vae_seconds: float = 0.0  # the final decode and encoding of the batch (previews not counted)


# ---------------------------------------------------------------------------------------------
# The decoder.


class VisionDecoder:
    def __init__(
        self,
        config: VisionDecoderConfig,
        codebook: torch.Tensor,
        transformer: FluxDiT,
        guidance: Guidance,
        schedule: FlowMatchSchedule,
        vae_config: FluxVAEConfig,
        vae: FluxVAEDecoder | None,
        group: dist.ProcessGroup | None = None,
        guidance_groups: GuidanceGroups | None = None,
    ) -> None:
        """vae: rank 0's (the other ranks of a group never decode); group: the Ulysses group
        (None: the default group when torch.distributed is initialized, else one rank);
        guidance_groups: this rank's half of guidance parallelism (transformer is then its
        role's DiT, and guidance a TwoPassGuidance)."""
        c = transformer.config
        if codebook.dim() != 2 or codebook.shape[1] != c.cond_channels or c.vec_in_dim != c.cond_channels:
            raise ValueError(
                f"codebook {tuple(codebook.shape)} does not fit the transformer's condition "
                f"(cond_channels {c.cond_channels}, vec_in_dim {c.vec_in_dim})"
            )
        if vae_config.latent_channels != c.in_channels:
            raise ValueError(f"vae has {vae_config.latent_channels} latent channels, the transformer {c.in_channels}")
        if guidance.MODE != config.guidance:
            raise ValueError(f"guidance {guidance.MODE!r} given for a {config.guidance!r} checkpoint")
        self.config = config
        self.codebook = codebook.float()  # (num_codes, cond)
        self.transformer = transformer
        self.guidance = guidance
        self.schedule = schedule
        self.vae_config = vae_config
        self.vae = vae
        if guidance_groups is not None and not isinstance(guidance, TwoPassGuidance):
            raise ValueError(f"guidance {guidance.MODE!r} has one pass a step: nothing to run in parallel")
        self.group = group
        self.guidance_groups = guidance_groups
        self.device = codebook.device
        # pixels per token each way; sides must also divide by 16, as the reference asserts
        self.size_multiple = math.lcm(PATCH_SCALE, vae_config.upscale * c.patch)
        self._encoders: ThreadPoolExecutor | None = None  # rank 0's, made at its first image
        self.step_cache_policy = StepCachePolicy()  # the steps that always run every block

    @classmethod
    def from_dir(
        cls,
        path: str | Path,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
        group: dist.ProcessGroup | None = None,
        cfg_batched: bool = True,
        vae_dtype: torch.dtype | None = None,  # default: the DiT's
        guidance_groups: GuidanceGroups | None = None,
        compile_dit: bool = False,
    ) -> VisionDecoder:
        """Load either layout of the module docstring (the published one when the folder has a
        model_index.json). The VAE is loaded on rank 0 of the world only. cfg_batched=False
        runs CFG's two passes one after the other. guidance_groups: this rank's place in a
        group split for guidance parallelism (it then loads its role's DiT alone, and its
        Ulysses group is the role's, not `group`). compile_dit: the DiTs' blocks run compiled
        (compiled_dit.py), compiled here, before the worker reports ready."""
        path = Path(path)
        device = torch.device(device)
        folder = DecoderFolder.read(path, device)
        config = folder.config
        guidance_class = GUIDANCE[config.guidance]
        if guidance_groups is None:
            transformer = FluxDiT.from_dir(path / "transformer", device=device, dtype=dtype)
            guidance = guidance_class.from_dir(folder, transformer, device, dtype)
        elif issubclass(guidance_class, TwoPassGuidance):
            transformer, guidance = guidance_class.for_role(folder, guidance_groups.role, device, dtype)
            group = guidance_groups.ulysses
        else:
            raise ValueError(f"{path}: guidance {config.guidance!r} has one pass a step: nothing to run in parallel")
        if isinstance(guidance, ClassifierFreeGuidance):
            guidance.batched = cfg_batched
        if compile_dit:
            compiled_dit.compile_blocks([transformer, *(m for m in vars(guidance).values() if isinstance(m, FluxDiT))])
        vae_config = FluxVAEConfig.from_diffusers(read_json(path / "vae" / "config.json"))
        leader = not dist.is_initialized() or dist.get_rank() == 0  # the world's rank 0, whatever `group`
        vae_dtype = dtype if vae_dtype is None else vae_dtype
        vae = FluxVAEDecoder.from_dir(path / "vae", device=device, dtype=vae_dtype) if leader else None
        decoder = cls(
            config, folder.codebook, transformer, guidance, folder.schedule, vae_config, vae, group, guidance_groups
        )
        if compile_dit:
            compiled_dit.warm_up(decoder)
        return decoder

    @property
    def num_codes(self) -> int:
        return self.codebook.shape[0]

    @property
    def is_leader(self) -> bool:
        return self.vae is not None

    def check_batch(self, jobs: Sequence[protocol.ImageJob]) -> None:
        """A batch's jobs must share width, height and steps: the server's contract, so a
        mixed batch is a ValueError for the whole batch, not a job's error."""
        shapes = {(job.width, job.height, job.steps) for job in jobs}
        if len(shapes) > 1:
            raise ValueError(f"a batch's jobs must share width, height and steps, got {sorted(shapes)}")

    def job_error(self, job: protocol.ImageJob) -> str | None:
        """Why this job cannot be drawn (a client error), or None."""
        rows, cols = self.config.code_grid
        m = self.size_multiple
        if len(job.codes) != self.config.num_codes_per_image:
            return f"an image needs {rows}x{cols} = {rows * cols} codes, got {len(job.codes)}"
        bad = next((c for c in job.codes if not 0 <= c < self.num_codes), None)
        if bad is not None:
            return f"image code {bad} is outside the codebook [0, {self.num_codes})"
        if not (0 < job.width <= MAX_SIDE and 0 < job.height <= MAX_SIDE) or job.width % m or job.height % m:
            return f"image size {job.width}x{job.height}: both sides must be multiples of {m} up to {MAX_SIDE}"
        if job.steps < 1:
            return f"steps must be at least 1, got {job.steps}"
        if not 0 <= job.seed < 2**64:
            return f"seed {job.seed} is outside [0, 2**64)"
        if job.output_format not in IMAGE_FORMATS:
            return f"output format {job.output_format!r} is not one of {', '.join(IMAGE_FORMATS)}"
        if job.quality is not None and not 0 <= job.quality <= 100:
            return f"quality {job.quality} is outside 0..100"
        if not 0 <= job.partial_images <= MAX_PREVIEWS:
            return f"partial_images {job.partial_images} is outside 0..{MAX_PREVIEWS}"
        scale = job.guidance_scale
        if scale is not None and not (math.isfinite(scale) and scale >= 0):
            return f"guidance_scale must be a finite number >= 0, got {scale}"
        if not (math.isfinite(job.step_cache) and job.step_cache >= 0):
            return f"step_cache must be a finite number >= 0, got {job.step_cache}"
        return None

    def decode(self, jobs: Sequence[protocol.ImageJob]) -> Generation:
        """generate, with its previews dropped."""
        for event in self.generate(jobs):
            if isinstance(event, Generation):
                return event
        raise AssertionError("generate ended without a Generation")

    def generate(self, jobs: Sequence[protocol.ImageJob]) -> Iterator[Preview | Generation]:
        """Previews as they are made (rank 0), then the batch's Generation (last). Every rank
        of the group must run it with the same jobs."""
        self.check_batch(jobs)
        errors = [self.job_error(job) for job in jobs]
        drawn = [job for job, error in zip(jobs, errors) if error is None]
        latents, step_seconds, cache = None, 0.0, None
        if drawn:
            latents, step_seconds, cache = yield from self._sample(drawn)
        if not self.is_leader:
            yield Generation([], None, step_seconds)
            return
        started = time.perf_counter()
        # each image is encoded on the pool while the VAE decodes the next (the worker thread)
        rows = latents if latents is not None else ()
        encoded = iter([self._encode(latent, job) for latent, job in zip(rows, drawn)])
        blocks = iter(zip(cache.blocks_computed, cache.blocks_skipped) if cache is not None else ())
        images = [
            protocol.DecodedImage(job.job_id, b"", job.width, job.height, error=error)
            if error is not None
            else protocol.DecodedImage(job.job_id, next(encoded).result(), job.width, job.height, None, *next(blocks))
            for job, error in zip(jobs, errors)
        ]
        yield Generation(images, latents, step_seconds, time.perf_counter() - started)

    def close(self) -> None:
        if self._encoders is not None:
            self._encoders.shutdown(wait=True)
            self._encoders = None

    def _sample(
        self, jobs: list[protocol.ImageJob]
    ) -> Generator[Preview, None, tuple[torch.Tensor | None, float, StepCache]]:
        """The Euler loop over the batch; returns (latents (B, 16, h, w) on rank 0 else None,
        mean seconds of a step, the step cache with its counts). Yields the previews on the way, in step order, each once its
        encoding (on the pool, while the next steps run) is done."""
        p, steps = self.transformer.config.patch, jobs[0].steps
        h, w = jobs[0].height // self.vae_config.upscale, jobs[0].width // self.vae_config.upscale
        shard = TokenShard(self.group, position_ids(h // p, w // p, device=self.device))
        x, cond, vec = self._inputs(jobs, shard, (h, w))
        host_scales = [self._scale(job) for job in jobs]
        scales = torch.tensor(host_scales, device=self.device)  # (B,)
        guided = any(scale != 0 for scale in host_scales)
        sigmas = self.schedule.sigmas(steps, image_seq_len=shard.num_tokens).tolist()  # exact, N + 1
        # what the DiT sees: timesteps truncated to integers, over num_train_timesteps, then
        # times 1000 in float32, in the reference's order (its sigma, then time_factor)
        truncated = self.schedule.model_sigmas(steps, image_seq_len=shard.num_tokens)
        timesteps = truncated.to(self.device) * TIMESTEP_SCALE
        previews = _preview_steps(jobs, steps)
        thresholds = [job.step_cache for job in jobs]
        cache = StepCache(thresholds, steps, shard.valid_tokens, shard.sum_across_ranks, self.step_cache_policy)
        encoding: deque[tuple[int, int, Future[bytes]]] = deque()  # (job_id, index, bytes), step order
        clock = StepClock(self.device)
        for i in range(steps):
            clock.start()
            cache.step = i
            step = StepInputs(x, cond, vec, timesteps[i].expand(len(jobs)), scales, guided, cache)
            v = self._velocity(shard, step)
            x_next = self._euler(x, v, sigmas[i], sigmas[i + 1])
            clock.stop()
            while encoding and encoding[0][2].done():
                job_id, index, data = encoding.popleft()
                yield Preview(job_id, index, data.result())
            if i in previews:
                clean = self._clean(shard, x, v, sigmas[i], (h, w))  # a gather: every rank takes part
                for row, index in previews[i] if self.is_leader else []:
                    encoding.append((jobs[row].job_id, index, self._encode(clean[row], jobs[row])))
            x = x_next
        latents = self._whole(shard, x, (h, w))
        if self.guidance_groups is not None:  # each half counted its own pass
            cache.blocks_computed, cache.blocks_skipped = self.guidance_groups.sum_counts(
                cache.blocks_computed, cache.blocks_skipped, self.device
            )
        for job_id, index, data in encoding:
            yield Preview(job_id, index, data.result())
        return (latents if self.is_leader else None), clock.seconds() / steps, cache

    @torch.inference_mode()
    def _inputs(
        self, jobs: list[protocol.ImageJob], shard: TokenShard, latent_hw: tuple[int, int]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """This rank's latent and condition tokens and the vec: (B, L, p*p*16), (B, L, cp*cp*cond), (B, cond)."""
        c = self.transformer.config
        p, cp = c.patch, c.condition_patch
        noise = torch.stack([initial_noise((c.in_channels, *latent_hw), job.seed, self.device) for job in jobs])
        codes = torch.tensor([job.codes for job in jobs], dtype=torch.int64, device=self.device)  # (B, rows*cols)
        # the map on the grid it is packed from: the latent's (cp = p), or the tokens' (cp = 1)
        h, w = latent_hw
        cond_hw = (h * cp // p, w * cp // p)
        cond_map, vec = condition_from_codes(codes, self.codebook, cond_hw)  # (B, cond, *cond_hw), (B, cond)
        return shard.shard(patchify(noise, p)), shard.shard(patchify(cond_map, cp)), vec

    @torch.inference_mode()
    def _velocity(self, shard: TokenShard, step: StepInputs) -> torch.Tensor:
        if self.guidance_groups is None:
            return self.guidance.velocity(shard, self.transformer, step)
        assert isinstance(self.guidance, TwoPassGuidance)  # __init__ refuses any other with guidance_groups
        return parallel_velocity(self.guidance, self.guidance_groups, shard, self.transformer, step)

    @torch.inference_mode()
    def _euler(self, x: torch.Tensor, v: torch.Tensor, sigma: float, sigma_next: float) -> torch.Tensor:
        return euler_step(x, v, sigma, sigma_next)  # float32: v is

    @torch.inference_mode()
    def _clean(
        self, shard: TokenShard, x: torch.Tensor, v: torch.Tensor, sigma: float, latent_hw: tuple[int, int]
    ) -> torch.Tensor:
        """The clean latent the step predicts, x0 = x_t - sigma_t * v, whole: (B, 16, h, w)."""
        return self._whole(shard, x - sigma * v, latent_hw)

    @torch.inference_mode()
    def _whole(self, shard: TokenShard, x: torch.Tensor, latent_hw: tuple[int, int]) -> torch.Tensor:
        """This rank's tokens (B, L, p*p*16) -> every rank's, as a latent (B, 16, h, w)."""
        p = self.transformer.config.patch
        h, w = latent_hw
        return unpatchify(shard.gather(x), h // p, w // p, p)

    @torch.inference_mode()
    def _encode(self, latent: torch.Tensor, job: protocol.ImageJob) -> Future[bytes]:
        """One job's latent (16, h, w) -> its encoded image, to come. The VAE decodes here, one
        job at a time (the bytes depend on the job's latent alone, not on its batch, and memory
        on one image); the pixels come to the host here too (the pool's threads never touch
        the device), and the pool encodes them."""
        assert self.vae is not None
        image = self.vae.decode(latent[None])[0].float().cpu()  # (3, H, W), nominally [-1, 1]
        if self._encoders is None:
            self._encoders = ThreadPoolExecutor(ENCODE_THREADS, thread_name_prefix="image-encode")
        if job.quality is None:
            return self._encoders.submit(to_image_bytes, image, job.output_format)
        return self._encoders.submit(to_image_bytes, image, job.output_format, max(job.quality, 1))  # the floor is 1

    def _scale(self, job: protocol.ImageJob) -> float:
        return self.config.guidance_scale if job.guidance_scale is None else float(job.guidance_scale)


def _preview_steps(jobs: Sequence[protocol.ImageJob], steps: int) -> dict[int, list[tuple[int, int]]]:
    """step index -> (row, preview index) of each job that gets a preview there: after steps
    floor(k * N / (p + 1)), k = 1..p, those before the last (see the module docstring)."""
    at: dict[int, list[tuple[int, int]]] = {}
    for row, job in enumerate(jobs):
        n = job.partial_images
        chosen = sorted({k * steps // (n + 1) for k in range(1, n + 1)} - {steps - 1})
        for index, i in enumerate(chosen):
            at.setdefault(i, []).append((row, index))
    return at


class StepClock:
    """Seconds spent inside the steps, read without making any step wait: on a GPU a pair of
    CUDA events per step, read once at the end (the last event's wait is the only sync); on
    the CPU the wall clock, as a step's work is done when its calls return."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._spans: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._started: torch.cuda.Event | float = 0.0
        self._seconds = 0.0

    def start(self) -> None:
        self._started = self._record() if self.cuda else time.perf_counter()

    def stop(self) -> None:
        if isinstance(self._started, torch.cuda.Event):
            self._spans.append((self._started, self._record()))
        else:
            self._seconds += time.perf_counter() - self._started

    def seconds(self) -> float:
        if self._spans:
            self._spans[-1][1].synchronize()
            self._seconds += sum(a.elapsed_time(b) for a, b in self._spans) / 1000  # ms
            self._spans = []
        return self._seconds

    @staticmethod
    def _record() -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()  # on the current device's current stream (the runner sets the device)
        return event
