"""Cross-check: the C++ reference (through `ropekv golden write --random`) against the numpy
oracle, every byte of every expected tensor, on >= 300 random problems.

Env: ROPEKV_BIN (required, else skipped), ROPEKV_ORACLE_CASES (default 300),
ROPEKV_ORACLE_SEED (default 20261129), ROPEKV_ORACLE_MAX_TOKENS (default 32)."""
import json
import os
import subprocess
from collections import Counter

import numpy as np
import pytest
from safetensors.numpy import save_file

import oracle as o
from oracle.check import check_golden

CASES = int(os.environ.get("ROPEKV_ORACLE_CASES", "300"))
SEED = int(os.environ.get("ROPEKV_ORACLE_SEED", "20261129"))
MAX_TOKENS = int(os.environ.get("ROPEKV_ORACLE_MAX_TOKENS", "32"))


SHUFFLED_CASES = int(os.environ.get("ROPEKV_ORACLE_SHUFFLED_CASES", "100"))
SCALES_CASES = int(os.environ.get("ROPEKV_ORACLE_SCALES_CASES", "100"))
DECODE_CASES = int(os.environ.get("ROPEKV_ORACLE_DECODE_CASES", "100"))
DSMLA_CASES = int(os.environ.get("ROPEKV_ORACLE_DSMLA_CASES", "100"))
KH_CASES = int(os.environ.get("ROPEKV_ORACLE_KH_CASES", "50"))
ZC_CASES = int(os.environ.get("ROPEKV_ORACLE_ZC_CASES", "60"))


def _write_random(ropekv_bin, out, cases, seed, *extra):
    cmd = [ropekv_bin, "golden", "write", "--random", str(cases), "--seed", str(seed),
           "--max-tokens", str(MAX_TOKENS), "--out", str(out), *extra]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout}\n{r.stderr}"
    files = sorted(out.glob("case-*.safetensors"))
    assert len(files) == cases, f"{' '.join(cmd)} wrote {len(files)} files, expected {cases}"
    return files


@pytest.fixture(scope="module")
def golden_dir(ropekv_bin, tmp_path_factory):
    return _write_random(ropekv_bin, tmp_path_factory.mktemp("golden-random"), CASES, SEED)


def test_reference_matches_oracle_bytewise(golden_dir):
    failed, ties = [], []
    for path in golden_dir:
        r = check_golden(path)
        if not r.ok:
            failed.append(r)
        if r.ties:
            ties.append(r)
    for r in ties:  # documented double-rounding ties: allowed, always shown
        print(r.report())
    msg = "\n".join(r.report() for r in failed[:10])
    assert not failed, f"{len(failed)} of {len(golden_dir)} cases differ from the oracle:\n{msg}"


def _check_pinned(ropekv_bin, tmp_path_factory, cases, seed, pin, what, check_file):
    """`golden write --random` with `--pin PIN`, each file checked by check_file(meta, tensors)
    and then against the oracle, byte for byte."""
    files = _write_random(ropekv_bin, tmp_path_factory.mktemp("golden-pinned"), cases, seed, "--pin", pin)
    failed = []
    for path in files:
        check_file(*o.load_golden(path))
        r = check_golden(path)
        if not r.ok:
            failed.append(r)
    msg = "\n".join(r.report() for r in failed[:10])
    assert not failed, f"{len(failed)} of {len(files)} {what} cases differ from the oracle:\n{msg}"


def test_reference_matches_oracle_on_the_shuffled_layout(ropekv_bin, tmp_path_factory):
    """Layout shuffled pinned: the oracle unshuffles the initial cache by reshapes, writes the
    entries, shuffles back (AITER's shuffle_kv_buffer, in numpy), byte for byte."""
    def check_file(meta, tensors):
        assert o.parse_repro(meta["repro"])["layout"] == "shuffled", meta["repro"]

    _check_pinned(ropekv_bin, tmp_path_factory, SHUFFLED_CASES, SEED + 1, "layout=shuffled", "shuffled",
                  check_file)


def test_reference_matches_oracle_with_scale_tensors(ropekv_bin, tmp_path_factory):
    """scales=tensor pinned: the oracle takes the scales from the files' [1] f32 tensors k_scale /
    q_scale (not from the repro's floats), byte for byte."""
    def check_file(meta, tensors):
        assert o.parse_repro(meta["repro"])["scales"] == "tensor", meta["repro"]
        assert tensors["k_scale"].dtype == np.float32 and tensors["k_scale"].shape == (1,)

    _check_pinned(ropekv_bin, tmp_path_factory, SCALES_CASES, SEED + 2, "scales=tensor", "scale-tensor",
                  check_file)


def test_reference_matches_oracle_with_decode_outputs(ropekv_bin, tmp_path_factory):
    """dec_out=qzk pinned (N from each case's seed: 0, Tq and in between): the oracle computes
    decode_q_pe_out, q_nope_zeros_out and k_pe_out from SPEC "Decode outputs", byte for byte;
    the campaign must hold cases with 0 < N < Tq (the rows AITER's Triton op gets wrong)."""
    kinds = Counter()

    def check_file(meta, tensors):
        p = o.parse_repro(meta["repro"])
        assert p["dec_out"] == "qzk", meta["repro"]
        n = p["dec"]
        assert tensors["decode_q_pe_out.expected"].shape == (n, p["h"], p["dr"])
        assert tensors["q_nope_zeros_out.expected"].shape == (n, p["h"], p["dn"])
        k_rows = (p["tk"], p["kh"], p["dr"]) if p["kh"] > 1 else (p["tk"], p["dr"])  # kv heads
        assert tensors["k_pe_out.expected"].shape == k_rows
        kinds["0<N<Tq" if 0 < n < p["tq"] else "N=Tq>0" if n == p["tq"] > 0 else "N=0"] += 1

    _check_pinned(ropekv_bin, tmp_path_factory, DECODE_CASES, SEED + 3, "dec_out=qzk", "decode-output",
                  check_file)
    if DECODE_CASES >= 50:
        assert kinds["0<N<Tq"] > 0 and kinds["N=Tq>0"] > 0, kinds


def test_oracle_shuffle_is_the_spec_formula():
    """shuffle_cache (reshapes) against core/SPEC.md's offset formula, written out here, and
    unshuffle_cache is its inverse."""
    nb, bs, dn, dr = 2, 32, 48, 16
    for w in (4, 8, 16):
        logical = np.arange(nb * bs * (dn + dr), dtype=np.int64).reshape(nb, bs, dn + dr)
        phys = o.oracle.shuffle_cache(logical, dn, w).reshape(nb, -1)
        for b in range(nb):
            for e in range(bs):
                for f in range(dn + dr):
                    part, width, start = (f, dn, 0) if f < dn else (f - dn, dr, bs * dn)
                    off = (start + (e // 16) * 16 * width + (part // w) * 16 * w + (e % 16) * w +
                           part % w)
                    assert phys[b, off] == logical[b, e, f], (w, b, e, f)
        back = o.oracle.unshuffle_cache(phys.reshape(nb, bs, dn + dr), dn, w)
        assert np.array_equal(back, logical)


def test_cross_check_catches_an_fp32_evaluation(golden_dir, monkeypatch):
    """The comparison is sharp: an oracle that evaluates rope in fp32 (fl32(fl32(x*C) +
    fl32(R*S)), as a plain fp32 kernel would) must disagree with the reference somewhere."""
    exact = o.oracle.round_exact_to_format

    def fp32_eval(a, b, fmt, conv=None, scale=None):
        with np.errstate(over="ignore", invalid="ignore"):
            s = (np.asarray(a, np.float32) + np.asarray(b, np.float32)).astype(np.float64)
        return exact(s, np.zeros_like(s), fmt, conv, scale)

    monkeypatch.setattr(o.oracle, "round_exact_to_format", fp32_eval)
    monkeypatch.setattr(o.oracle, "round_double_eval_to_format", fp32_eval)
    bad = sum(not check_golden(p).ok for p in golden_dir)
    assert bad > 0, "an fp32-evaluating oracle matched every byte: the cross-check is blind"


def test_reference_matches_oracle_on_the_fp8_ds_mla_layout(ropekv_bin, tmp_path_factory):
    """Layout fp8_ds_mla pinned (the tile scale rule from each case's seed: amax and pow2): the
    oracle computes each 656-byte entry (tile amax, fp32 scale, e4m3fn values, f32 scales, 16-bit
    rope) from SPEC "The fp8_ds_mla layout", byte for byte; the campaign holds both rules."""
    rules = Counter()

    def check_file(meta, tensors):
        p = o.parse_repro(meta["repro"])
        assert p["layout"] == "fp8_ds_mla" and p["cache"] == "u8", meta["repro"]
        assert tensors["cache.expected"].shape == (p["nb"], p["bs"], 656)
        rules[p["ds_scale"]] += 1

    _check_pinned(ropekv_bin, tmp_path_factory, DSMLA_CASES, SEED + 4, "layout=fp8_ds_mla", "fp8_ds_mla",
                  check_file)
    if DSMLA_CASES >= 50:
        assert rules["amax"] > 0 and rules["pow2"] > 0, rules


@pytest.mark.parametrize("kh", [2, 3, 4])
def test_reference_matches_oracle_with_kv_heads(ropekv_bin, tmp_path_factory, kh):
    """kh pinned (KH > 1 kv heads, AITER's form; h made a multiple of kh): kv_c / k_pe /
    k_pe_out [Tk, KH, D] and the caches [nb, KH, bs, D] (every layout but fp8_ds_mla); the oracle
    writes entry (slot, head k) from kv_c[t, k] / k_pe[t, k] per SPEC "kv heads", byte for byte.
    ROPEKV_ORACLE_KH_CASES (default 50) cases in all, split over kh = 2, 3, 4."""
    layouts = Counter()

    def check_file(meta, tensors):
        p = o.parse_repro(meta["repro"])
        assert p["kh"] == kh and p["h"] % kh == 0, meta["repro"]
        assert tensors["kv_c"].shape == (p["tk"], kh, p["dn"])
        assert tensors["k_pe"].shape == (p["tk"], kh, p["dr"])
        cache = "cache.expected" if p["layout"] != "split" else "ckv_cache.expected"
        assert tensors[cache].shape[:3] == (p["nb"], kh, p["bs"]), tensors[cache].shape
        layouts[p["layout"]] += 1

    cases = max(1, KH_CASES // 3 + (1 if kh == 2 and KH_CASES % 3 else 0) + (1 if kh == 3 and KH_CASES % 3 == 2 else 0))
    _check_pinned(ropekv_bin, tmp_path_factory, cases, SEED + 5 + kh, f"kh={kh}", f"kh={kh}", check_file)
    if cases >= 50:
        assert layouts["joint"] > 0 and layouts["split"] > 0 and layouts["shuffled"] > 0, layouts


def test_reference_matches_oracle_zero_copy(ropekv_bin, tmp_path_factory):
    """zero_copy=1 pinned (q_nope is q_out's first Dn columns): the files hold q_nope and a
    q_out.initial whose first Dn columns are those same bytes; the oracle computes q_out from
    them as for any case (computed rows: the nope columns are q_nope's values; skipped rows keep
    q_out.initial), byte for byte. ROPEKV_ORACLE_ZC_CASES (default 60)."""
    skipped = Counter()

    def check_file(meta, tensors):
        p = o.parse_repro(meta["repro"])
        assert p["zero_copy"] and p["qo"] == p["in"], meta["repro"]
        q_nope, initial = tensors["q_nope"], tensors["q_out.initial"]
        assert np.array_equal(initial[..., : p["dn"]].view(np.uint8), q_nope.view(np.uint8))
        skipped[p["pad_q"]] += 1

    _check_pinned(ropekv_bin, tmp_path_factory, ZC_CASES, SEED + 9, "zero_copy=1", "zero-copy", check_file)
    if ZC_CASES >= 40:
        assert skipped["skipped"] > 0 and skipped["computed"] > 0, skipped


def test_oracle_ds_mla_scales_by_hand():
    """The oracle's tile scales on values worked out by hand: a zero tile (FLT_MIN, or 2^-13 for
    pow2), 336 / 448 = 0.75 (pow2: 1.0), and e4m3fn codes of the quantised values."""
    rows = np.zeros((1, 512), dtype=np.float32)
    rows[0, 128:131] = [336.0, -168.0, 1.0]
    rows[0, 256] = 3.0
    amax = o.ds_mla_tile_scales(rows, "amax")
    pow2 = o.ds_mla_tile_scales(rows, "pow2")
    assert amax[0].tolist() == [2.0 ** -126, 0.75, float(np.float32(3.0) / np.float32(448.0)), 2.0 ** -126]
    assert pow2[0].tolist() == [2.0 ** -13, 1.0, 2.0 ** -7, 2.0 ** -13]
    rope = np.zeros((1, 64), dtype=o.NP_DTYPES["bf16"])
    e_amax = o.ds_mla_entries(rows, rope, "amax")[0]
    e_pow2 = o.ds_mla_entries(rows, rope, "pow2")[0]
    assert e_amax[128:131].tolist() == [0x7e, 0xf6, 0x3b]  # 448, -224, 1.375
    assert e_pow2[128:131].tolist() == [0x7a, 0xf2, 0x38]  # 320, -160, 1 (ties to even)
    assert e_pow2[256] == 0x7c  # 3 / 2^-7 = 384
    assert e_pow2[512 + 4:512 + 8].tolist() == [0, 0, 0x80, 0x3f]  # 1.0f little-endian
    assert e_amax.shape == (656,)


def test_random_cases_cover_every_option(golden_dir):
    seen = Counter()
    for path in golden_dir:
        meta, _ = o.load_golden(path)
        p = o.parse_repro(meta["repro"])
        for key in ("in", "table_dtype", "pos", "slot", "qo", "cache", "table", "style", "layout",
                    "ds_scale", "order", "scale_conv", "pad_q", "pos_oob", "inplace_q", "inplace_k",
                    "scales", "q_layout", "kv_layout", "pad_at", "positions"):
            seen[(key, p[key])] += 1
        seen[("pad_slots>0", p["pad_slots"] > 0)] += 1
        seen[("tq=0", p["tq"] == 0)] += 1
        seen[("tq<ts", p["tq"] < p["ts"])] += 1
        seen[("ts<tk", p["ts"] < p["tk"])] += 1
        seen[("padded strides", p["row_pad"] + p["entry_pad"] + p["block_pad"] > 0)] += 1
    want = [(k, v) for k, vals in o.oracle._ENUMS.items() for v in vals]
    want += [(k, b) for k in ("inplace_q", "inplace_k") for b in (False, True)]
    want += [(k, True) for k in ("pad_slots>0", "tq=0", "tq<ts", "ts<tk", "padded strides")]
    missing = [w for w in want if not seen[w]]
    assert not missing, f"{len(golden_dir)} random cases never exercise: {missing}"


# --- the checker itself, on files written here (no C++ needed) ---------------------------------
def _write_case(path, repro, tensors, expected, dtypes):
    st = {}
    for n, a in {**tensors, **expected}.items():
        st[n] = a.view(np.uint8) if dtypes[n].endswith("fnuz") else a
    meta = {"format": "ropekv-golden", "contract_version": "1", "repro": repro,
            "dtypes": json.dumps(dtypes)}
    save_file(st, str(path), metadata=meta)


def _random_case(repro, seed):
    """Inputs of a problem drawn in Python (independently of the C++ generator)."""
    p = o.parse_repro(repro)
    rng = np.random.default_rng(seed)
    tq, ts, tk, h, dn, dr, P = p["tq"], p["ts"], p["tk"], p["h"], p["dn"], p["dr"], p["p"]
    nb, bs = p["nb"], p["bs"]
    ind = o.NP_DTYPES[p["in"]]
    t = {"q_nope": rng.uniform(-4, 4, (tq, h, dn)), "q_pe": rng.uniform(-4, 4, (tq, h, dr)),
         "kv_c": rng.uniform(-4, 4, (tk, dn)), "k_pe": rng.uniform(-4, 4, (tk, dr))}
    t = {n: a.astype(np.float32).astype(ind) for n, a in t.items()}
    ang = rng.uniform(0, 7, (P, dr // 2))
    td = o.NP_DTYPES[p["table_dtype"]]
    if p["table"] == "one":
        t["cos_sin"] = np.concatenate([np.cos(ang), np.sin(ang)], 1).astype(np.float32).astype(td)
    else:
        t["cos"], t["sin"] = (np.cos(ang).astype(np.float32).astype(td),
                              np.sin(ang).astype(np.float32).astype(td))
    t["positions"] = rng.integers(0, P, tk).astype(o.NP_DTYPES[p["pos"]])
    slots = rng.permutation(nb * bs)[:ts]
    slots[rng.random(ts) < 0.3] = -1
    t["slot_mapping"] = slots.astype(o.NP_DTYPES[p["slot"]])
    qo, cd = o.NP_DTYPES[p["qo"]], o.NP_DTYPES[p["cache"]]
    t["q_out.initial"] = rng.uniform(-9, 9, (tq, h, dn + dr)).astype(np.float32).astype(qo)
    t["cache.initial"] = rng.uniform(-9, 9, (nb, bs, dn + dr)).astype(np.float32).astype(cd)
    dtypes = {n: next(k for k, v in o.NP_DTYPES.items() if v == a.dtype) for n, a in t.items()}
    return p, t, dtypes


@pytest.mark.parametrize("flip", [None, ("q_out.expected", 7), ("cache.expected", 1)])
def test_checker_reports_a_flipped_byte(tmp_path, flip):
    repro = ("tq=2 ts=3 tk=4 h=2 dn=8 dr=4 p=5 bs=3 nb=2 in=bf16 table_dtype=f32 qo=fp8_e4m3fnuz "
             "cache=fp8_e5m2 k_scale=0.5 q_scale=3 scale_conv=reciprocal")
    p, t, dtypes = _random_case(repro, 11)
    exp = o.expected_outputs(p, t)
    for n, a in exp.items():
        dtypes[n] = dtypes[n.replace(".expected", ".initial")]
    if flip:
        name, elem = flip
        flat = exp[name].reshape(-1).view(np.uint8)
        flat[elem] ^= 0x01
    path = tmp_path / "case.safetensors"
    _write_case(path, repro, t, exp, dtypes)
    r = check_golden(path)
    if flip is None:
        assert r.ok and r.compared_bytes > 0 and not r.ties, r.report()
        return
    assert not r.ok and r.mismatch_count == 1, r.report()
    e = r.mismatches[0]
    assert e.tensor == flip[0]
    assert e.index == np.unravel_index(flip[1], exp[flip[0]].shape)
    text = r.report()
    assert repro in text and e.got_bits in text and e.want_bits in text


def test_checker_reports_missing_tensor_and_bad_file(tmp_path):
    repro = "tq=1 ts=1 tk=1 h=1 dn=2 dr=4 p=3 bs=2 nb=1 in=f32 table_dtype=f32 qo=f32 cache=f32"
    p, t, dtypes = _random_case(repro, 5)
    exp = o.expected_outputs(p, t)
    del exp["cache.expected"]
    dtypes["q_out.expected"] = "f32"
    _write_case(tmp_path / "c.safetensors", repro, t, exp, dtypes)
    r = check_golden(tmp_path / "c.safetensors")
    assert not r.ok and any("cache.expected" in x for x in r.problems), r.report()
    (tmp_path / "trunc.safetensors").write_bytes((tmp_path / "c.safetensors").read_bytes()[:40])
    r = check_golden(tmp_path / "trunc.safetensors")
    assert not r.ok and r.problems and r.problems[0].startswith("cannot load"), r.report()
