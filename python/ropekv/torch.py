"""The op as a PyTorch custom op: `torch.ops.ropekv.mla_rope_cache_concat`.

    import ropekv.torch   # registers the op
    torch.ops.ropekv.mla_rope_cache_concat(q_nope, q_pe, kv_c, k_pe, positions, slot_mapping,
                                           cos_sin, None, None, q_out, cache, None, None,
                                           k_scale=1.0, q_scale=1.0)

`shuffled_cache=True` takes `cache` in AITER's shuffled layout (core/SPEC.md). The decode
outputs (core/SPEC.md "Decode outputs") are optional keyword tensors: `decode_q_pe_out`
[N, H, Dr], `q_nope_zeros_out` [N, H, Dn] (N <= Tq) and `k_pe_out` [Tk, (KH,) Dr]. KH kv heads
(core/SPEC.md "kv heads", AITER's form): kv_c / k_pe [Tk, KH, D] and caches [num_blocks, KH,
block_size, D], read off the tensors' shapes. It mutates q_out
and the cache(s) (and q_pe / k_pe with inplace_q / inplace_k, and the decode outputs given),
declared in its schema; returns nothing. CPU tensors run the reference; CUDA / ROCm tensors run ropekv's GPU
kernel when the package was built with it (`pip install . -C cmake.define.ROPEKV_GPU=nvidia`):
on the caller's current stream, with no synchronisation and no allocation, so it can be
captured in a CUDA graph. A fake implementation serves torch.compile. Arguments are checked
before anything is written (an error names the tensor, expected vs got). Scales: Python floats,
or 1-element float32 tensors on the tensors' device (`k_scale_tensor=`, `q_scale_tensor=`; `call`
routes a tensor given as `k_scale` there): the kernel reads a tensor's value when it runs, so a
captured CUDA graph uses the value the tensor holds at each replay.
The kernel hands raw data pointers to the C++ library, so no libtorch build is involved and
every torch version with torch.library.custom_op (2.4+) serves.
"""
from typing import Optional, Union

import torch

from . import Unsupported, _c

_DTYPES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16",
           torch.float8_e4m3fn: "fp8_e4m3fn", torch.float8_e4m3fnuz: "fp8_e4m3fnuz",
           torch.float8_e5m2: "fp8_e5m2", torch.float8_e5m2fnuz: "fp8_e5m2fnuz",
           torch.int32: "i32", torch.int64: "i64"}
_NAMES = ("q_nope", "q_pe", "kv_c", "k_pe", "positions", "slot_mapping", "cos_sin", "cos", "sin",
          "q_out", "cache", "ckv_cache", "kpe_cache")
_DECODE_NAMES = ("decode_q_pe_out", "k_pe_out", "q_nope_zeros_out")
_CHOICES = {"style": ("gptj", "neox"), "order": ("nope_first", "rope_first"),
            "scale_conv": ("divide", "reciprocal"), "pad_q": ("computed", "skipped"),
            "pos_oob": ("error", "clamp")}


def _scale_tensor(name: str, v: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """A 1-element scale tensor as the [1] view the C++ op takes (its dtype is checked there)."""
    if v is None:
        return None
    if v.numel() != 1:
        raise ValueError(f"{name}: expected a 1-element float32 tensor, got shape {list(v.shape)}")
    return v.reshape(1)


def _run(tensors: dict, k_scale: float, q_scale: float, style: str, order: str, scale_conv: str,
         pad_q: str, pos_oob: str, inplace_q: bool, inplace_k: bool, shuffled_cache: bool) -> None:
    present = {n: t for n, t in tensors.items() if t is not None}
    devices = {t.device for t in present.values()}
    if len(devices) != 1:
        where = ", ".join(f"{n}: {t.device}" for n, t in present.items())
        raise ValueError(f"tensors: expected one device for every tensor, got {where}")
    device = devices.pop()
    for key, value in (("style", style), ("order", order), ("scale_conv", scale_conv),
                       ("pad_q", pad_q), ("pos_oob", pos_oob)):
        if value not in _CHOICES[key]:
            raise ValueError(f"{key}: expected one of {', '.join(_CHOICES[key])}, got '{value}'")
    specs = []
    for name, t in present.items():
        if t.dtype not in _DTYPES:
            raise ValueError(f"{name}: expected one of the dtypes {sorted(_DTYPES.values())}, got {t.dtype}")
        specs.append((name, t.data_ptr(), _DTYPES[t.dtype], list(t.shape), list(t.stride())))
    layout = "shuffled" if shuffled_cache else "joint" if tensors.get("cache") is not None else "split"
    options = (f"style={style} layout={layout} order={order} scale_conv={scale_conv} pad_q={pad_q} "
               f"pos_oob={pos_oob} inplace_q={int(inplace_q)} inplace_k={int(inplace_k)}")
    if device.type == "cpu":
        _c.run_op(specs, options, k_scale, q_scale, False, 0)
    else:
        stream = torch.cuda.current_stream(device).cuda_stream
        _c.run_op(specs, options, k_scale, q_scale, True, stream)


@torch.library.custom_op("ropekv::mla_rope_cache_concat",
                         mutates_args=("q_pe", "k_pe", "q_out", "cache", "ckv_cache", "kpe_cache",
                                       "decode_q_pe_out", "k_pe_out", "q_nope_zeros_out"))
def mla_rope_cache_concat(q_nope: torch.Tensor,            # [Tq, H, Dn]
                          q_pe: torch.Tensor,              # [Tq, H, Dr] (written with inplace_q)
                          kv_c: torch.Tensor,              # [Tk, Dn] or [Tk, KH, Dn]
                          k_pe: torch.Tensor,              # [Tk, (KH,) Dr] (written with inplace_k)
                          positions: torch.Tensor,         # [Tk] int32 | int64
                          slot_mapping: torch.Tensor,      # [Ts] int32 | int64, < 0: padding
                          cos_sin: Optional[torch.Tensor],  # [P, Dr]: Dr/2 cos then Dr/2 sin
                          cos: Optional[torch.Tensor],     # [P, Dr/2] (with sin, instead of cos_sin)
                          sin: Optional[torch.Tensor],     # [P, Dr/2]
                          q_out: torch.Tensor,             # [Tq, H, Dn + Dr]
                          cache: Optional[torch.Tensor],   # [num_blocks, (KH,) block_size, Dn + Dr] (joint, shuffled)
                          ckv_cache: Optional[torch.Tensor],  # [num_blocks, (KH,) block_size, Dn] (split)
                          kpe_cache: Optional[torch.Tensor],  # [num_blocks, (KH,) block_size, Dr] (split)
                          k_scale: float = 1.0, q_scale: float = 1.0, style: str = "gptj",
                          order: str = "nope_first", scale_conv: str = "divide",
                          pad_q: str = "computed", pos_oob: str = "error",
                          inplace_q: bool = False, inplace_k: bool = False,
                          shuffled_cache: bool = False,
                          k_scale_tensor: Optional[torch.Tensor] = None,  # [1] float32: k_scale read at run time
                          q_scale_tensor: Optional[torch.Tensor] = None,  # [1] float32: q_scale read at run time
                          decode_q_pe_out: Optional[torch.Tensor] = None,   # [N, H, Dr] q_pe's dtype, N <= Tq
                          k_pe_out: Optional[torch.Tensor] = None,          # [Tk, (KH,) Dr] k_pe's dtype
                          q_nope_zeros_out: Optional[torch.Tensor] = None,  # [N, H, Dn] q_nope's dtype
                          ) -> None:
    tensors = dict(zip(_NAMES, (q_nope, q_pe, kv_c, k_pe, positions, slot_mapping, cos_sin, cos, sin,
                                q_out, cache, ckv_cache, kpe_cache)))
    for name, value, tensor in (("k_scale", k_scale, k_scale_tensor), ("q_scale", q_scale, q_scale_tensor)):
        if tensor is not None and value != 1.0:
            raise ValueError(f"{name}: expected a float or a tensor ({name}_tensor), got both "
                             f"({value} and a tensor)")
        tensors[name] = _scale_tensor(name, tensor)
    for name, tensor in zip(_DECODE_NAMES, (decode_q_pe_out, k_pe_out, q_nope_zeros_out)):
        tensors[name] = tensor
    _run(tensors, k_scale, q_scale, style, order, scale_conv, pad_q, pos_oob, inplace_q, inplace_k,
         shuffled_cache)


@mla_rope_cache_concat.register_fake
def _(q_nope, q_pe, kv_c, k_pe, positions, slot_mapping, cos_sin, cos, sin, q_out, cache,
      ckv_cache, kpe_cache, k_scale=1.0, q_scale=1.0, style="gptj", order="nope_first",
      scale_conv="divide", pad_q="computed", pos_oob="error", inplace_q=False, inplace_k=False,
      shuffled_cache=False, k_scale_tensor=None, q_scale_tensor=None, decode_q_pe_out=None,
      k_pe_out=None, q_nope_zeros_out=None):
    return None


def call(tensors: dict, k_scale: Union[float, torch.Tensor] = 1.0,
         q_scale: Union[float, torch.Tensor] = 1.0, **options) -> None:
    """The op on a dict of tensors by their golden names (ropekv.Case.to_torch's keys). A scale
    given as a tensor (or, without one, a dict entry "k_scale" / "q_scale") is read by the kernel
    at run time. Decode outputs are taken from the dict by their names (decode_q_pe_out,
    k_pe_out, q_nope_zeros_out) when present."""
    scales = {n: tensors[n] for n in _DECODE_NAMES if tensors.get(n) is not None}
    for name, v in (("k_scale", k_scale), ("q_scale", q_scale)):
        if isinstance(v, torch.Tensor):
            scales[name + "_tensor"] = v
        elif tensors.get(name) is not None and v == 1.0:
            scales[name + "_tensor"] = tensors[name]
        else:
            scales[name] = float(v)
    torch.ops.ropekv.mla_rope_cache_concat(*(tensors.get(n) for n in _NAMES), **scales, **options)


def kernel(tensors: dict, problem) -> None:
    """`ropekv.fuzz`-shaped wrapper: runs the op with the problem's options (fuzz the op itself
    with ropekv.fuzz(ropekv.torch.kernel, framework="torch", device="cuda")). A case with
    scales=tensor holds the scales as tensors "k_scale" / "q_scale": the op gets those."""
    if problem.layout == "fp8_ds_mla":  # the op takes no tile scale rule (core/SPEC.md)
        raise Unsupported("not supported: the fp8_ds_mla cache layout (the PyTorch op has no argument for it)")
    k_scale = tensors["k_scale"] if tensors.get("k_scale") is not None else problem.k_scale
    q_scale = tensors["q_scale"] if tensors.get("q_scale") is not None else problem.q_scale
    try:
        call(tensors, k_scale=k_scale, q_scale=q_scale, style=problem.style,
             order=problem.order, scale_conv=problem.scale_conv, pad_q=problem.pad_q,
             pos_oob=problem.pos_oob, inplace_q=bool(problem.inplace_q),
             inplace_k=bool(problem.inplace_k), shuffled_cache=problem.layout == "shuffled")
    except _c.UnsupportedError as e:  # outside the GPU kernel's domain: raised before any write
        raise Unsupported(str(e)) from None
