"""The fused MLA op written as a user would in plain PyTorch, unfused: rope on q_pe and k_pe,
an indexed copy of [kv_c | rope(k_pe)] into the paged cache, a cat for q_out. It follows
core/SPEC.md: both rope styles, one or two cos/sin tables, joint (either row order), split,
shuffled and fp8_ds_mla caches, fp8 outputs with either scale convention and saturation, padding
slots, in-place rope, AITER's decode outputs (decode_q_pe_out, q_nope_zeros_out, k_pe_out) when the
call passes them.

    mla_rope_cache_concat(tensors, problem)       # tensors by their golden names; writes in place

`bug` plants one mistake (for the example's tests): "neox_partner" (pairs of the wrong style),
"slot_off_by_one" (cache entry s + 1), "no_q_scale" (fp8 q_out not divided by q_scale).
"""
import torch


def _to_output(x32: torch.Tensor, dtype: torch.dtype, scale: float, conv: str) -> torch.Tensor:
    """fp32 values into an output dtype: fp8 scaled (divide / reciprocal) and saturated."""
    if dtype.is_floating_point and torch.finfo(dtype).bits == 8:
        if conv == "divide":
            # a true division: on CUDA, dividing by a scalar multiplies by its reciprocal
            # instead (found by ropekv.fuzz on an H200: 1 ULP off in the exact nope part)
            x32 = x32 / torch.full_like(x32, scale)
        else:
            x32 = x32 * (torch.tensor(1.0, dtype=torch.float32) / torch.tensor(scale, dtype=torch.float32))
        fmax = torch.finfo(dtype).max
        x32 = torch.where(torch.isnan(x32), x32, x32.clamp(-fmax, fmax))
    return x32.to(dtype)


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, style: str) -> torch.Tensor:
    """x [..., Dr] fp32; cos, sin broadcastable to [..., Dr/2] fp32."""
    half = x.shape[-1] // 2
    out = torch.empty_like(x)
    if style == "gptj":
        a, b = x[..., 0::2], x[..., 1::2]
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = b * cos + a * sin
    else:
        a, b = x[..., :half], x[..., half:]
        out[..., :half] = a * cos - b * sin
        out[..., half:] = b * cos + a * sin
    return out


def mla_rope_cache_concat(t: dict, p, bug: str = "") -> None:
    q_nope, q_pe, kv_c, k_pe = t["q_nope"], t["q_pe"], t["kv_c"], t["k_pe"]
    positions, slots = t["positions"].long(), t["slot_mapping"].long()
    tq, ts = q_nope.shape[0], slots.shape[0]
    dn, dr = q_nope.shape[2], q_pe.shape[2]
    half = dr // 2
    if "cos_sin" in t:
        cos_all, sin_all = t["cos_sin"][:, :half], t["cos_sin"][:, half:]
    else:
        cos_all, sin_all = t["cos"], t["sin"]
    rows = cos_all.shape[0]
    style = ("neox" if p.style == "gptj" else "gptj") if bug == "neox_partner" else p.style

    # which tokens are used (SPEC.md "Rope"), their positions checked or clamped
    dev = q_nope.device
    tok = torch.arange(ts, device=dev)
    writes_cache = slots >= 0
    q_rows = tok < tq
    computes_q = q_rows if p.pad_q == "computed" else (q_rows & writes_cache)
    used = writes_cache | computes_q
    pos = positions[:ts]
    if p.pos_oob == "clamp":
        pos = pos.clamp(0, rows - 1)
    elif bool(((pos < 0) | (pos >= rows))[used].any()):
        raise ValueError("positions: a used token's position is outside the cos/sin table")
    pos = torch.where(used, pos, torch.zeros_like(pos))
    cos = cos_all[pos].float()                 # [Ts, Dr/2]
    sin = sin_all[pos].float()

    # q: [q_nope | rope(q_pe)] for the computed q rows
    qi = torch.nonzero(computes_q[:tq]).flatten()
    q_rot = _rope(q_pe[qi].float(), cos[qi][:, None, :], sin[qi][:, None, :], style)
    q_scale = 1.0 if bug == "no_q_scale" else p.q_scale
    q_out = t["q_out"]
    q_out[qi] = torch.cat([_to_output(q_nope[qi].float(), q_out.dtype, q_scale, p.scale_conv),
                           _to_output(q_rot, q_out.dtype, q_scale, p.scale_conv)], dim=-1)
    # decode outputs (core/SPEC.md "Decode outputs"), when the call passes them: computed q rows t < N
    qd = qi[qi < p.dec]
    if "decode_q_pe_out" in t:
        t["decode_q_pe_out"][qd] = q_rot[:qd.numel()].to(q_pe.dtype)
    if "q_nope_zeros_out" in t:
        t["q_nope_zeros_out"][qd] = 0
    if p.inplace_q:
        q_pe[qi] = q_rot.to(q_pe.dtype)

    # k: rope, then [kv_c | rope(k_pe)] into the cache entries of the written tokens. kv heads
    # (core/SPEC.md "kv heads"): k rows [Tk, KH, D] and caches [nb, KH, bs, D]; one head's rank-2
    # rows and rank-3 caches are viewed with a head dimension of 1, so one code path serves both.
    def heads(x, rank):
        return x if x.dim() == rank else x.unsqueeze(1)

    kv_c, k_pe = heads(kv_c, 3), heads(k_pe, 3)
    ki = torch.nonzero(writes_cache).flatten()
    k_rot = _rope(k_pe[ki].float(), cos[ki][:, None, :], sin[ki][:, None, :], style)  # [rows, KH, Dr]
    s = slots[ki] + (1 if bug == "slot_off_by_one" else 0)
    cache_dtype = (t["cache"] if "cache" in t else t["ckv_cache"]).dtype
    if p.layout != "fp8_ds_mla":
        nope = _to_output(kv_c[ki].float(), cache_dtype, p.k_scale, p.scale_conv)
        rope = _to_output(k_rot, cache_dtype, p.k_scale, p.scale_conv)
    if p.layout == "fp8_ds_mla":  # vLLM's DeepSeek V3.2 entries: e4m3fn tiles, f32 scales, rope (one head)
        cache = t["cache"]  # [num_blocks, block_size, 656] uint8
        block, entry = s // cache.shape[1], s % cache.shape[1]
        x = kv_c[ki, 0].float().reshape(-1, 4, 128)
        scale = x.abs().amax(dim=-1) / torch.full_like(x[..., 0], 448.0)  # a true fp32 division
        if p.ds_scale == "pow2":  # the smallest power of two >= max(scale, 1e-4)
            mant, exp = torch.frexp(scale.clamp(min=1e-4))
            scale = torch.where(mant == 0.5, scale.clamp(min=1e-4), torch.ldexp(torch.ones_like(scale), exp))
        else:
            scale = scale.clamp(min=torch.finfo(torch.float32).tiny)
        q = (x / scale[..., None]).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
        cache[block, entry] = torch.cat([q.reshape(-1, 512).view(torch.uint8), scale.contiguous().view(torch.uint8),
                                         k_rot[:, 0].to(k_pe.dtype).view(torch.uint8)], dim=-1)
    elif p.layout == "joint":
        cache = heads(t["cache"], 4)
        block, entry = s // cache.shape[2], s % cache.shape[2]
        row = torch.cat([nope, rope] if p.order == "nope_first" else [rope, nope], dim=-1)
        cache[block, :, entry] = row  # [rows, KH, Dn + Dr]
    elif p.layout == "shuffled":  # AITER's 16-entry tiles of 16-byte runs, per (block, head) (core/SPEC.md)
        cache = heads(t["cache"], 4)
        nb, kh, bs, width = cache.shape
        w = 16 // cache.element_size()
        block, entry = s // bs, s % bs
        runs = cache.as_strided((nb, kh, bs * width), (cache.stride(0), cache.stride(1), 1))  # each run packed
        hd = torch.arange(kh)
        for vals, start, d in ((nope, 0, p.dn), (rope, bs * p.dn, p.dr)):
            f = torch.arange(d)
            off = (start + (entry // 16)[:, None] * 16 * d + (f // w)[None, :] * 16 * w +
                   (entry % 16)[:, None] * w + (f % w)[None, :])
            runs[block[:, None, None], hd[None, :, None], off[:, None, :]] = vals
    else:
        ckv, kpe = heads(t["ckv_cache"], 4), heads(t["kpe_cache"], 4)
        block, entry = s // ckv.shape[2], s % ckv.shape[2]
        ckv[block, :, entry] = nope
        kpe[block, :, entry] = rope
    if "k_pe_out" in t:  # the rows the cache gets
        heads(t["k_pe_out"], 3)[ki] = k_rot.to(k_pe.dtype)
    if p.inplace_k:
        k_pe[ki] = k_rot.to(k_pe.dtype)
